package registry_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// slowStore is a memstore whose refreshes each wait for a token on gate,
// standing in for a database that answers slowly. Each refresh first tells
// reading which peers it reads. The test sends the changes itself.
type slowStore struct {
	*memstore.Store
	gate    chan struct{}
	reading chan []string
	changes chan registry.Change
}

func (s *slowStore) Subscribe(context.Context) <-chan registry.Change { return s.changes }

func (s *slowStore) Refresh(ctx context.Context, ids []string) ([]registry.Peer, []registry.Quarantine, []registry.Preflight, error) {
	select {
	case s.reading <- slices.Sorted(slices.Values(ids)):
	case <-ctx.Done():
		return nil, nil, nil, ctx.Err()
	}
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

// TestMirrorTakesAHintedStalePeerOutAtOnce: a peer hinted stale
// (Change.Stale) leaves the routes before the mirror has read it back from
// a slow store, and the record the store then returns replaces the
// mirror's; a peer whose change comes without a hint stays until its read
// answers; a hint about an earlier generation than the mirror's record is
// ignored.
func TestMirrorTakesAHintedStalePeerOutAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &slowStore{Store: memstore.New(memstore.Config{}), gate: make(chan struct{}),
		reading: make(chan []string), changes: make(chan registry.Change, 8)}
	var peers []registry.Peer
	for _, spec := range []registry.PeerSpec{registrytest.Spec("p0", registry.RolePrefill),
		registrytest.Spec("d0", registry.RoleDecode), registrytest.Spec("d1", registry.RoleDecode), registrytest.Spec("d2", registry.RoleDecode)} {
		res, err := store.Register(ctx, spec, registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: res.Peer.InstanceID}); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, res.Peer)
	}
	d0, d1, d2 := peers[1], peers[2], peers[3]
	m := registry.NewMirror(registry.MirrorConfig{LoadRefresh: -1}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []registry.Peer{d0, d1, d2} {
		if !routable(m.Snapshot(), d.ID) {
			t.Fatalf("%s is not routable to begin with", d.Name)
		}
	}
	const reason = "test: transfer failed"
	for _, d := range []registry.Peer{d0, d1} {
		if _, err := store.MarkStale(ctx, d.ID, reason, ""); err != nil {
			t.Fatal(err)
		}
	}
	timeout := func() <-chan time.Time { return time.After(5 * time.Second) }
	expectRead := func(want ...string) {
		t.Helper()
		slices.Sort(want)
		select {
		case got := <-store.reading:
			if !slices.Equal(got, want) {
				t.Fatalf("the mirror reads %v, want %v", got, want)
			}
		case <-timeout():
			t.Fatalf("the mirror does not read %v", want)
		}
	}
	answer := func() {
		t.Helper()
		select {
		case store.gate <- struct{}{}:
		case <-timeout():
			t.Fatal("no read to answer")
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

	// d1's change has no hint: d1 stays in the routes while it is read.
	store.changes <- registry.Change{PeerIDs: []string{d1.ID}}
	expectRead(d1.ID)
	if !routable(m.Snapshot(), d1.ID) {
		t.Fatal("d1 left the routes before the store answered, and its change had no hint")
	}
	// d0's hint, then its change, arrive while the mirror reads d1; a hint
	// about d2 of an earlier generation than the mirror's comes with them.
	store.changes <- registry.Change{Stale: []registry.StaleHint{{ID: d0.ID, Generation: d0.Generation}, {ID: d2.ID, Generation: d2.Generation - 1}}}
	store.changes <- registry.Change{PeerIDs: []string{d0.ID}}
	answer() // d1's read
	waitFor("d1 out after its read", func(s *registry.Snapshot) bool { return !routable(s, d1.ID) })
	// d0 leaves the routes before its own read answers: its record is the
	// mirror's copy, with the state the hint gave and not the store's reason.
	expectRead(d0.ID)
	if routable(m.Snapshot(), d0.ID) {
		t.Fatal("d0 still routable while it is read, after its hint")
	}
	if p, _ := m.Snapshot().Peer(d0.ID); p.State != registry.StateStale || p.StateReason == reason {
		t.Fatalf("d0 before its read: %s (%q), want stale with the mirror's earlier reason", p.State, p.StateReason)
	}
	if !routable(m.Snapshot(), d2.ID) {
		t.Fatal("a hint about an earlier generation of d2 took it out of the routes")
	}
	answer() // d0's read
	waitFor("d0's record from the store", func(s *registry.Snapshot) bool {
		p, _ := s.Peer(d0.ID)
		return p.State == registry.StateStale && p.StateReason == reason
	})
}

// TestBroadcasterCarriesStaleHints: a change of hints only is not a reload
// of everything, and hints pending for a slow subscriber keep each peer's
// latest generation.
func TestBroadcasterCarriesStaleHints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var b registry.Broadcaster
	ch := b.Subscribe(ctx)
	b.Publish(registry.Change{Stale: []registry.StaleHint{{ID: "y", Generation: 1}}})
	select {
	case c := <-ch:
		if c.ReloadAll() || len(c.Stale) != 1 || c.Stale[0] != (registry.StaleHint{ID: "y", Generation: 1}) {
			t.Fatalf("got %+v (reload all: %v), want y's hint alone", c, c.ReloadAll())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change delivered")
	}
	for _, g := range []int64{1, 3, 2} {
		b.Publish(registry.Change{Stale: []registry.StaleHint{{ID: "x", Generation: g}}})
	}
	b.Publish(registry.Change{PeerIDs: []string{"x"}})
	var last int64
	deadline := time.After(5 * time.Second)
	for named := false; !named; {
		select {
		case c := <-ch:
			for _, h := range c.Stale {
				last = max(last, h.Generation)
			}
			named = slices.Contains(c.PeerIDs, "x")
		case <-deadline:
			t.Fatal("x's change was not delivered")
		}
	}
	if last != 3 {
		t.Fatalf("latest hinted generation %d, want 3", last)
	}
}
