package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// slowStore is a memstore whose refreshes each wait for a token on gate,
// standing in for a database that answers slowly, and whose changes the
// test sends itself on changes.
type slowStore struct {
	*memstore.Store
	gate    chan struct{}
	changes chan registry.Change
}

func (s *slowStore) Subscribe(context.Context) <-chan registry.Change { return s.changes }

func (s *slowStore) Refresh(ctx context.Context, ids []string) ([]registry.Peer, []registry.Quarantine, []registry.Preflight, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, nil, nil, ctx.Err()
	}
	var peers []registry.Peer
	for _, id := range ids {
		if p, err := s.Get(ctx, id); err == nil {
			peers = append(peers, p)
		}
	}
	qs, err := s.Quarantines(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	pfs, err := s.Preflights(ctx)
	return peers, qs, pfs, err
}

// routable reports whether peer id is among the model's routable decodes.
func routable(snap *registry.Snapshot, id string) bool {
	if r := snap.Routes("m"); r != nil {
		for _, p := range r.Decodes {
			if p.ID == id {
				return true
			}
		}
	}
	return false
}

// TestMirrorTakesAHintedStalePeerOutAtOnce: a change that names a peer as
// stale (Change.Stale) takes it out of the routes before the mirror has
// read it back from a slow store; the record the store then returns
// replaces the mirror's. A change without the hint waits for the read.
func TestMirrorTakesAHintedStalePeerOutAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &slowStore{Store: memstore.New(memstore.Config{}), gate: make(chan struct{}), changes: make(chan registry.Change, 8)}
	var ids []string
	for _, spec := range []registry.PeerSpec{registrytest.Spec("p0", registry.RolePrefill),
		registrytest.Spec("d0", registry.RoleDecode), registrytest.Spec("d1", registry.RoleDecode)} {
		res, err := store.Register(ctx, spec, registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: res.Peer.InstanceID}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Peer.ID)
	}
	d0, d1 := ids[1], ids[2]
	m := registry.NewMirror(registry.MirrorConfig{LoadRefresh: -1}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !routable(m.Snapshot(), d0) || !routable(m.Snapshot(), d1) {
		t.Fatal("the decodes are not routable to begin with")
	}
	const reason = "test: transfer failed"
	for _, id := range []string{d0, d1} {
		if _, err := store.MarkStale(ctx, id, reason, ""); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, ok func(*registry.Snapshot) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok(m.Snapshot()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5 s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// d1's change has no hint: the mirror reads d1, and until the store
	// answers d1 stays in the routes.
	store.changes <- registry.Change{PeerIDs: []string{d1}}
	time.Sleep(50 * time.Millisecond)
	if !routable(m.Snapshot(), d1) {
		t.Fatal("d1 left the routes before the store answered, and its change had no hint")
	}
	// d0's change comes with the hint while the mirror waits on d1's read.
	store.changes <- registry.Change{PeerIDs: []string{d0}, Stale: []string{d0, "not-a-peer-here"}}
	store.gate <- struct{}{} // d1's read answers
	waitFor("d1 out after its read", func(s *registry.Snapshot) bool { return !routable(s, d1) })
	// d0 leaves the routes before its own read answers: its record is the
	// mirror's copy, with the state the hint gave and not the store's reason.
	waitFor("d0 out on the hint", func(s *registry.Snapshot) bool { return !routable(s, d0) })
	if p, _ := m.Snapshot().Peer(d0); p.State != registry.StateStale || p.StateReason == reason {
		t.Fatalf("d0 before its read: %s (%q), want stale with the mirror's earlier reason", p.State, p.StateReason)
	}
	store.gate <- struct{}{} // d0's read answers
	waitFor("d0's record from the store", func(s *registry.Snapshot) bool {
		p, _ := s.Peer(d0)
		return p.State == registry.StateStale && p.StateReason == reason
	})
}

// TestBroadcasterMergesStaleHints: hints pending for a slow subscriber are
// merged with the changes and delivered together.
func TestBroadcasterMergesStaleHints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var b registry.Broadcaster
	ch := b.Subscribe(ctx)
	b.Publish(registry.Change{PeerIDs: []string{"a"}, Stale: []string{"a"}})
	b.Publish(registry.Change{PeerIDs: []string{"b"}})
	b.Publish(registry.Change{PeerIDs: []string{"c"}, Stale: []string{"c"}})
	ids, stale := map[string]bool{}, map[string]bool{}
	deadline := time.After(5 * time.Second)
	for len(ids) < 3 || len(stale) < 2 {
		select {
		case c := <-ch:
			for _, id := range c.PeerIDs {
				ids[id] = true
			}
			for _, id := range c.Stale {
				stale[id] = true
			}
		case <-deadline:
			t.Fatalf("got changes %v and hints %v, want a, b, c and a, c", ids, stale)
		}
	}
	if !stale["a"] || !stale["c"] || stale["b"] {
		t.Fatalf("hints %v, want a and c", stale)
	}
}
