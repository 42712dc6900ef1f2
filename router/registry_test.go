package router_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// testRegistry is the real registry the router runs against in these
// tests, wired as cmd/pdplane wires it: a store (memstore), a Mirror
// following it that is the router's Snapshots, and the store itself as the
// router's PeerReporter. Stale marks and quarantines therefore come from
// registry.ApplyTransferFailure, the one rule, and tests read them from the
// store's state, quarantines and events.
type testRegistry struct {
	store  *memstore.Store
	mirror *replica.Mirror
}

func newTestRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{store: memstore.New(memstore.Config{QuarantineTTL: registry.DefaultQuarantineTTL})}
	r.mirror = replica.NewMirror(replica.MirrorConfig{LoadRefresh: -1}, r.store, zerolog.New(zerolog.NewTestWriter(t)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := r.mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// register registers spec (or re-registers a peer of its name), makes it
// ready with a heartbeat when the store left it pending, and waits until
// the mirror routes that generation.
func (r *testRegistry) register(t testing.TB, spec registry.PeerSpec) registry.Peer {
	t.Helper()
	ctx := context.Background()
	res, err := r.store.Register(ctx, spec, registry.Claim{Admin: true})
	if err != nil {
		t.Fatalf("register %s: %v", spec.Name, err)
	}
	p := res.Peer
	if p.State != registry.StateReady {
		if _, err := r.store.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: spec.InstanceID}); err != nil {
			t.Fatalf("heartbeat %s: %v", spec.Name, err)
		}
	}
	simtest.WaitFor(t, "the mirror to route "+spec.Name, func() bool {
		s, ok := r.mirror.Snapshot().Peer(p.ID)
		return ok && s.State == registry.StateReady && s.Generation == p.Generation
	})
	s, _ := r.mirror.Snapshot().Peer(p.ID)
	return *s
}

// registerSim registers the simulated engine's own spec, as its agent
// would.
func (r *testRegistry) registerSim(t *testing.T, s *sim.Sim) registry.Peer {
	t.Helper()
	spec, err := s.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r.register(t, spec)
}

// reregisterSim has the simulated engine take a fresh agent, as a stale
// mark asks, and registers its new spec: a new generation.
func (r *testRegistry) reregisterSim(t *testing.T, s *sim.Sim, reason string) registry.Peer {
	t.Helper()
	if err := s.Reregister(context.Background(), reason); err != nil {
		t.Fatal(err)
	}
	return r.registerSim(t, s)
}

// peer returns the store's peer named name.
func (r *testRegistry) peer(t *testing.T, name string) registry.Peer {
	t.Helper()
	peers, err := r.store.List(context.Background(), registry.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no peer %s in the store", name)
	return registry.Peer{}
}

// id is the store's ID of the peer named name.
func (r *testRegistry) id(t *testing.T, name string) string { return r.peer(t, name).ID }

// markStale marks name stale as an operator would, and waits until the
// mirror no longer routes it.
func (r *testRegistry) markStale(t *testing.T, name string) {
	t.Helper()
	id := r.id(t, name)
	if _, err := r.store.MarkStale(context.Background(), id, "marked by the test", ""); err != nil {
		t.Fatal(err)
	}
	simtest.WaitFor(t, "the mirror to see "+name+" stale", func() bool {
		s, ok := r.mirror.Snapshot().Peer(id)
		return ok && s.State == registry.StateStale
	})
}

// staleEvents returns the stale events the store logged for name.
func (r *testRegistry) staleEvents(t *testing.T, name string) []registry.Event {
	t.Helper()
	evs, err := r.store.Events(context.Background(), registry.EventQuery{PeerID: r.id(t, name), Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []registry.Event
	for _, e := range evs {
		if e.Kind == registry.EventStale {
			out = append(out, e)
		}
	}
	return out
}

// waitStale waits until the store holds name stale and returns the stale
// event that made it so.
func (r *testRegistry) waitStale(t *testing.T, name string) registry.Event {
	t.Helper()
	simtest.WaitFor(t, name+" marked stale", func() bool { return r.peer(t, name).State == registry.StateStale })
	evs := r.staleEvents(t, name)
	return evs[0]
}

// waitQuarantine waits until the store holds a quarantine and returns it.
func (r *testRegistry) waitQuarantine(t *testing.T) registry.Quarantine {
	t.Helper()
	var qs []registry.Quarantine
	simtest.WaitFor(t, "a quarantine", func() bool {
		var err error
		qs, err = r.store.Quarantines(context.Background())
		return err == nil && len(qs) > 0
	})
	return qs[0]
}

// setupSims registers the simulated engines as their agents would (each
// sim's own registration) and starts a router over them.
func setupSims(t *testing.T, cfg router.Config, sims ...*sim.Sim) *bundle {
	t.Helper()
	peers := make([]registry.Peer, 0, len(sims))
	for _, s := range sims {
		spec, err := s.Spec(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, registry.Peer{PeerSpec: spec})
	}
	return setup(t, cfg, peers...)
}
