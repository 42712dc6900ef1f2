package transfer

import (
	"sync"

	"github.com/pdplane/pdplane/registry"
)

// RegionGuard keeps registered regions and the transfers that use them
// apart from deregistration: a transfer acquires its spans (which must lie in
// registered regions) and releases them when the bytes have moved;
// Deregister removes regions at once, so that no new transfer can use them,
// and then waits only for the transfers that were already using memory. New
// transfers never wait for a deregistration, so two agents deregistering
// while they transfer to each other cannot deadlock. It is safe for
// concurrent use.
type RegionGuard struct {
	deregMu sync.Mutex // one deregistration at a time

	mu      sync.Mutex
	cond    sync.Cond
	regions RegionSet
	epoch   uint64
	active  [2]int // transfers in flight, by epoch parity
}

// Access is a held acquisition; pass it to Release once.
type Access struct {
	epoch uint64
	ok    bool
}

// Register adds regions (see RegionSet.Add).
func (g *RegionGuard) Register(l DescList) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.regions.Add(l)
}

// Deregister removes regions (see RegionSet.Remove) and waits until every
// transfer that acquired memory before the call has released it.
func (g *RegionGuard) Deregister(l DescList) error {
	g.deregMu.Lock()
	defer g.deregMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.regions.Remove(l); err != nil {
		return err
	}
	g.waitLocked()
	return nil
}

// DeregisterAll removes every region and waits as Deregister does.
func (g *RegionGuard) DeregisterAll() []DescList {
	g.deregMu.Lock()
	defer g.deregMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []DescList
	for _, k := range g.regions.Kinds() {
		out = append(out, DescList{Kind: k, Descs: g.regions.Regions(k)})
	}
	g.regions = RegionSet{}
	g.waitLocked()
	return out
}

func (g *RegionGuard) waitLocked() {
	if g.cond.L == nil {
		g.cond.L = &g.mu
	}
	old := g.epoch
	g.epoch++
	for g.active[old%2] > 0 {
		g.cond.Wait()
	}
}

// Acquire checks that every span of each list lies in a registered region
// and holds them until Release.
func (g *RegionGuard) Acquire(lists ...DescList) (Access, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range lists {
		if err := g.regions.Contains(l); err != nil {
			return Access{}, err
		}
	}
	g.active[g.epoch%2]++
	return Access{epoch: g.epoch, ok: true}, nil
}

// Release ends an acquisition. Releasing a zero Access does nothing.
func (g *RegionGuard) Release(a Access) {
	if !a.ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active[a.epoch%2]--
	if g.active[a.epoch%2] == 0 && g.cond.L != nil {
		g.cond.Broadcast()
	}
}

// Snapshot returns the registered regions, by kind.
func (g *RegionGuard) Snapshot() []DescList {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []DescList
	for _, k := range g.regions.Kinds() {
		out = append(out, DescList{Kind: k, Descs: g.regions.Regions(k)})
	}
	return out
}

// Bytes is the registered bytes of kind k.
func (g *RegionGuard) Bytes(k registry.MemKind) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.regions.Bytes(k)
}

// Contains checks spans against the registered regions without holding
// them.
func (g *RegionGuard) Contains(l DescList) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.regions.Contains(l)
}
