package routertest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// Spec returns a registration of one engine with a KV geometry that pairs
// with every other Spec of the same model and engine protocol: one rank, one
// VRAM region, page size 16, bf16.
func Spec(name string, role registry.Role, engine registry.Engine, url, model string) registry.PeerSpec {
	s := registry.PeerSpec{
		Name:          name,
		Role:          role,
		Engine:        engine,
		URL:           url,
		BootstrapHost: "127.0.0.1",
		Model:         model,
		InstanceID:    name + "-instance",
		Parallelism:   registry.Parallelism{TPSize: 1, AttnTPSize: 1, DPSize: 1, PPSize: 1, DCPSize: 1},
		KV:            registry.KVGeometry{PageSize: 16, DType: "bf16", NumLayers: 2, NumKVHeads: 2, HeadDim: 64},
		Ranks: []registry.Rank{{
			Rank:       0,
			AgentName:  name + "-agent-0",
			KVDataPtrs: []uint64{0x10000},
			KVDataLens: []uint64{1 << 20},
			KVItemLens: []uint64{4096},
			KVMemKinds: []registry.MemKind{registry.VRAM},
		}},
	}
	return s.WithDefaults()
}

// ReadyPeer returns a ready peer of the spec at the generation, with ID
// "id-" + name.
func ReadyPeer(spec registry.PeerSpec, generation int64) registry.Peer {
	t := time.Unix(1_700_000_000, 0).UTC()
	return registry.Peer{
		PeerSpec:   spec,
		ID:         "id-" + spec.Name,
		State:      registry.StateReady,
		Generation: generation,
		CreatedAt:  t,
		UpdatedAt:  t,
	}
}

// Snapshots is a snapshot source whose peers a test sets; it satisfies the
// router's Snapshots interface.
type Snapshots struct {
	mu          sync.Mutex
	peers       []registry.Peer
	quarantines []registry.Quarantine
	version     uint64
	cur         atomic.Pointer[registry.Snapshot]
}

// NewSnapshots returns a source serving a snapshot of peers.
func NewSnapshots(peers ...registry.Peer) *Snapshots {
	s := &Snapshots{}
	s.Set(peers...)
	return s
}

// Snapshot returns the current snapshot.
func (s *Snapshots) Snapshot() *registry.Snapshot { return s.cur.Load() }

// Set replaces every peer (quarantines stay).
func (s *Snapshots) Set(peers ...registry.Peer) {
	s.Update(func(_ []registry.Peer, qs []registry.Quarantine) ([]registry.Peer, []registry.Quarantine) {
		return peers, qs
	})
}

// Update rebuilds the snapshot from what fn makes of the current peers and
// quarantines (copies, which fn may change).
func (s *Snapshots) Update(fn func(peers []registry.Peer, qs []registry.Quarantine) ([]registry.Peer, []registry.Quarantine)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	peers := append([]registry.Peer(nil), s.peers...)
	qs := append([]registry.Quarantine(nil), s.quarantines...)
	s.peers, s.quarantines = fn(peers, qs)
	s.version++
	s.cur.Store(registry.NewSnapshot(s.version, append([]registry.Peer(nil), s.peers...), s.quarantines, time.Now()))
}

// SetState changes one peer's state and, when generation is not zero, its
// generation.
func (s *Snapshots) SetState(id string, state registry.State, generation int64) {
	s.Update(func(peers []registry.Peer, qs []registry.Quarantine) ([]registry.Peer, []registry.Quarantine) {
		for i := range peers {
			if peers[i].ID == id {
				peers[i].State = state
				if generation != 0 && generation != peers[i].Generation {
					// A new generation means fresh NIXL agents, as a
					// real re-registration brings.
					peers[i].Generation = generation
					ranks := append([]registry.Rank(nil), peers[i].Ranks...)
					for r := range ranks {
						ranks[r].AgentName = fmt.Sprintf("%s-g%d", ranks[r].AgentName, generation)
					}
					peers[i].Ranks = ranks
				}
			}
		}
		return peers, qs
	})
}
