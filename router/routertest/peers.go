package routertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
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

// StaleMark is one report the Reporter turned into a stale mark.
type StaleMark struct {
	ID, Reason, ErrText string
	Reporter            string
}

// Reporter records the router's stale marks and quarantines; it satisfies
// the router's PeerReporter interface. Set OnMarkStale / OnQuarantine
// before use to act like a store (for instance, update a Snapshots).
type Reporter struct {
	OnMarkStale  func(m StaleMark)
	OnQuarantine func(q registry.Quarantine)

	mu          sync.Mutex
	pairAgent   map[[2]string]string // the decode agent of each pair's first failure
	markedAgent map[string]string    // decode ID -> agent already reported stale
	stale       []StaleMark
	quarantines []registry.Quarantine
	staleCh     chan StaleMark
	quarCh      chan registry.Quarantine
}

// NewReporter returns an empty recording reporter.
func NewReporter() *Reporter {
	return &Reporter{staleCh: make(chan StaleMark, 64), quarCh: make(chan registry.Quarantine, 64)}
}

// ReportTransferFailure acts as the registry's rule does
// (registry.ApplyTransferFailure), with the decode agent name standing for
// its generation: a first failure of a decode agent is a stale mark, a
// repeat about the same agent changes nothing, and a failure of a pair that
// already failed with an earlier agent of the decode is a quarantine.
func (r *Reporter) ReportTransferFailure(_ context.Context, f registry.TransferFailure) (registry.Peer, registry.TransferOutcome, error) {
	r.mu.Lock()
	if r.pairAgent == nil {
		r.pairAgent, r.markedAgent = map[[2]string]string{}, map[string]string{}
	}
	key := [2]string{f.PrefillID, f.DecodeID}
	prev, seen := r.pairAgent[key]
	switch {
	case seen && prev != f.DecodeAgent:
		r.mu.Unlock()
		q := registry.Quarantine{PrefillID: f.PrefillID, DecodeID: f.DecodeID, Detail: f.Error}
		r.recordQuarantine(q)
		return registry.Peer{ID: f.DecodeID, State: registry.StateReady}, registry.OutcomeQuarantined, nil
	case r.markedAgent[f.DecodeID] == f.DecodeAgent && f.DecodeAgent != "":
		r.mu.Unlock()
		return registry.Peer{ID: f.DecodeID, State: registry.StateStale}, registry.OutcomeAlreadyStale, nil
	}
	r.pairAgent[key] = f.DecodeAgent
	r.markedAgent[f.DecodeID] = f.DecodeAgent
	m := StaleMark{ID: f.DecodeID, Reason: f.Reason, ErrText: f.Error, Reporter: f.Reporter}
	r.stale = append(r.stale, m)
	r.mu.Unlock()
	if r.OnMarkStale != nil {
		r.OnMarkStale(m)
	}
	select {
	case r.staleCh <- m:
	default:
	}
	return registry.Peer{ID: f.DecodeID, State: registry.StateStale, StateReason: f.Reason}, registry.OutcomeStale, nil
}

// SeedFailure records that the pair already failed with an earlier agent of
// the decode, as if another router replica had reported it: the next
// failure of that pair is a quarantine.
func (r *Reporter) SeedFailure(prefillID, decodeID, earlierAgent string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pairAgent == nil {
		r.pairAgent, r.markedAgent = map[[2]string]string{}, map[string]string{}
	}
	r.pairAgent[[2]string{prefillID, decodeID}] = earlierAgent
}

func (r *Reporter) recordQuarantine(q registry.Quarantine) {
	r.mu.Lock()
	r.quarantines = append(r.quarantines, q)
	r.mu.Unlock()
	if r.OnQuarantine != nil {
		r.OnQuarantine(q)
	}
	select {
	case r.quarCh <- q:
	default:
	}
}

// StaleMarks returns the stale marks so far.
func (r *Reporter) StaleMarks() []StaleMark {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]StaleMark(nil), r.stale...)
}

// Quarantines returns the quarantines so far.
func (r *Reporter) Quarantines() []registry.Quarantine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]registry.Quarantine(nil), r.quarantines...)
}

// WaitStale waits for the next stale mark, failing the test after timeout.
func (r *Reporter) WaitStale(t testing.TB, timeout time.Duration) StaleMark {
	t.Helper()
	select {
	case m := <-r.staleCh:
		return m
	case <-time.After(timeout):
		t.Fatalf("no stale mark within %v", timeout)
		return StaleMark{}
	}
}

// WaitQuarantine waits for the next quarantine, failing the test after
// timeout.
func (r *Reporter) WaitQuarantine(t testing.TB, timeout time.Duration) registry.Quarantine {
	t.Helper()
	select {
	case q := <-r.quarCh:
		return q
	case <-time.After(timeout):
		t.Fatalf("no quarantine within %v", timeout)
		return registry.Quarantine{}
	}
}
