package replica_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// slowStore is a memstore whose refreshes each wait for a token on gate,
// standing in for a database that answers slowly: a refresh reads the peers
// when it begins, as a query reads the database's state when it starts, and
// returns them once the gate opens. Each refresh first tells reading which
// peers it reads. The test sends the changes itself.
type slowStore struct {
	*memstore.Store
	gate    chan struct{}
	reading chan []string
	changes chan registry.Change
	// slowList makes List, a reload of every peer, slow too; it then
	// tells reading "*".
	slowList atomic.Bool
}

func (s *slowStore) List(ctx context.Context, f registry.Filter) ([]registry.Peer, error) {
	peers, err := s.Store.List(ctx, f)
	if err != nil || !s.slowList.Load() {
		return peers, err
	}
	select {
	case s.reading <- []string{"*"}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return peers, nil
}

func (s *slowStore) Subscribe(context.Context) <-chan registry.Change { return s.changes }

func (s *slowStore) Refresh(ctx context.Context, ids []string) ([]registry.Peer, []registry.Quarantine, []registry.Preflight, error) {
	peers, qs, pfs, err := readPeers(ctx, s.Store, ids)
	if err != nil {
		return nil, nil, nil, err
	}
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
	return peers, qs, pfs, nil
}

// routable reports whether peer id is among the model's routable decodes.
func routable(snap *replica.Snapshot, id string) bool {
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
// a slow store, even while the mirror waits on another read, and the record
// the store then returns replaces the mirror's; a peer whose change comes
// without a hint stays until its read answers; a hint about an earlier
// generation than the mirror's record is ignored; a read that began before
// a hint arrived, of some peers or of all, does not bring the hinted peer
// back.
func TestMirrorTakesAHintedStalePeerOutAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &slowStore{Store: memstore.New(memstore.Config{}), gate: make(chan struct{}),
		reading: make(chan []string), changes: make(chan registry.Change, 8)}
	peers := registerReady(t, ctx, store.Store, "d0", "d1", "d2", "d3", "d4")
	d0, d1, d2, d3, d4 := peers[0], peers[1], peers[2], peers[3], peers[4]
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: -1}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []registry.Peer{d0, d1, d2, d3, d4} {
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
	waitFor := func(what string, ok func(*replica.Snapshot) bool) {
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
	// d0's hint, then its change, arrive while the mirror waits for d1's
	// read; a hint about d2 of an earlier generation than the mirror's
	// comes with them. d0 leaves the routes at once: its record is the
	// mirror's copy, with the state the hint gave and not the store's
	// reason.
	store.changes <- registry.Change{Stale: []registry.StaleHint{{ID: d0.ID, Generation: d0.Generation}, {ID: d2.ID, Generation: d2.Generation - 1}}}
	store.changes <- registry.Change{PeerIDs: []string{d0.ID}}
	waitFor("d0 out while the mirror waits for d1's read", func(s *replica.Snapshot) bool { return !routable(s, d0.ID) })
	if p, _ := m.Snapshot().Peer(d0.ID); p.State != registry.StateStale || p.StateReason == reason {
		t.Fatalf("d0 before its read: %s (%q), want stale with the mirror's earlier reason", p.State, p.StateReason)
	}
	if !routable(m.Snapshot(), d1.ID) {
		t.Fatal("d1 left the routes before its read answered")
	}
	answer() // d1's read
	waitFor("d1 out after its read", func(s *replica.Snapshot) bool { return !routable(s, d1.ID) })
	expectRead(d0.ID)
	if routable(m.Snapshot(), d0.ID) {
		t.Fatal("d0 routable again while it is read, after its hint")
	}
	if !routable(m.Snapshot(), d2.ID) {
		t.Fatal("a hint about an earlier generation of d2 took it out of the routes")
	}
	answer() // d0's read
	waitFor("d0's record from the store", func(s *replica.Snapshot) bool {
		p, _ := s.Peer(d0.ID)
		return p.State == registry.StateStale && p.StateReason == reason
	})

	// A read (of the peers read names, "*" for all) begins while d is
	// ready; d is marked stale and its hint arrives before that read
	// answers. The read's older record must not bring d back into the
	// routes; d's own change then reads the mark.
	markDuringRead := func(d registry.Peer, read registry.Change, reading string) {
		t.Helper()
		store.changes <- read
		expectRead(reading)
		if _, err := store.MarkStale(ctx, d.ID, reason, ""); err != nil {
			t.Fatal(err)
		}
		store.changes <- registry.Change{Stale: []registry.StaleHint{{ID: d.ID, Generation: d.Generation}}}
		waitFor(d.Name+" out after its hint", func(s *replica.Snapshot) bool { return !routable(s, d.ID) })
		answer() // the read that began before the mark
		store.slowList.Store(false)
		store.changes <- registry.Change{PeerIDs: []string{d.ID}}
		expectRead(d.ID)
		if routable(m.Snapshot(), d.ID) {
			t.Fatalf("a read of %s that began before %s's hint brought it back into the routes", reading, d.Name)
		}
		answer()
		waitFor(d.Name+"'s record from the store", func(s *replica.Snapshot) bool {
			p, _ := s.Peer(d.ID)
			return p.State == registry.StateStale && p.StateReason == reason
		})
	}
	markDuringRead(d3, registry.Change{PeerIDs: []string{d3.ID}}, d3.ID)
	store.slowList.Store(true) // a reload of every peer (the listener reconnected)
	markDuringRead(d4, registry.Change{}, "*")
}

// TestBroadcasterCarriesStaleHints: a change of hints only is not a reload
// of everything, and hints pending for a slow subscriber keep each peer's
// latest generation.
func TestBroadcasterCarriesStaleHints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var b replica.Broadcaster
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

// failingStore is a memstore whose next fail refreshes fail, standing in for
// a database that is away; each refresh is counted on tries. The test sends
// the changes itself.
type failingStore struct {
	*memstore.Store
	fail    atomic.Int32
	tries   chan struct{}
	changes chan registry.Change
}

func (s *failingStore) Subscribe(context.Context) <-chan registry.Change { return s.changes }

func (s *failingStore) Refresh(ctx context.Context, ids []string) ([]registry.Peer, []registry.Quarantine, []registry.Preflight, error) {
	s.tries <- struct{}{}
	if s.fail.Add(-1) >= 0 {
		return nil, nil, nil, errors.New("test: the database is away")
	}
	return readPeers(ctx, s.Store, ids)
}

// readPeers is a Refresh of store: the peers with ids that exist, and the
// pair state.
func readPeers(ctx context.Context, store *memstore.Store, ids []string) ([]registry.Peer, []registry.Quarantine, []registry.Preflight, error) {
	var peers []registry.Peer
	for _, id := range ids {
		if p, err := store.Get(ctx, id); err == nil {
			peers = append(peers, p)
		}
	}
	qs, err := store.Quarantines(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	pfs, err := store.Preflights(ctx)
	return peers, qs, pfs, err
}

// registerReady registers a prefill p0 and the named decodes in store and
// heartbeats each once, so that they are ready; it returns the decodes.
func registerReady(t *testing.T, ctx context.Context, store *memstore.Store, decodes ...string) []registry.Peer {
	t.Helper()
	specs := []registry.PeerSpec{registrytest.Spec("p0", registry.RolePrefill)}
	for _, name := range decodes {
		specs = append(specs, registrytest.Spec(name, registry.RoleDecode))
	}
	var peers []registry.Peer
	for _, spec := range specs {
		res, err := store.Register(ctx, spec, registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: res.Peer.InstanceID}); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, res.Peer)
	}
	return peers[1:]
}

// TestMirrorRetriesAFailedRead: a change whose read fails is kept, the
// snapshot routes as before meanwhile, and the next announcement (here a
// hint about no peer the mirror holds) retries it without waiting out the
// backoff, which this test sets to an hour.
func TestMirrorRetriesAFailedRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &failingStore{Store: memstore.New(memstore.Config{}), tries: make(chan struct{}, 8), changes: make(chan registry.Change, 8)}
	d := registerReady(t, ctx, store.Store, "d0")[0]
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: -1, MinRetry: time.Hour, MaxRetry: time.Hour}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const reason = "test: transfer failed"
	if _, err := store.MarkStale(ctx, d.ID, reason, ""); err != nil {
		t.Fatal(err)
	}
	store.fail.Store(1)
	try := func() {
		t.Helper()
		select {
		case <-store.tries:
		case <-time.After(5 * time.Second):
			t.Fatal("the mirror does not read")
		}
	}
	store.changes <- registry.Change{PeerIDs: []string{d.ID}}
	try() // fails
	if !routable(m.Snapshot(), d.ID) {
		t.Fatal("d0 left the routes though its read failed")
	}
	store.changes <- registry.Change{Stale: []registry.StaleHint{{ID: "00000000-0000-0000-0000-000000000000", Generation: 1}}}
	try() // the retry, woken by the announcement
	deadline := time.Now().Add(5 * time.Second)
	for {
		if p, _ := m.Snapshot().Peer(d.ID); p.State == registry.StateStale && p.StateReason == reason {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the retried read did not publish d0's mark")
		}
		time.Sleep(time.Millisecond)
	}
	if routable(m.Snapshot(), d.ID) {
		t.Fatal("d0 routable after its mark was read")
	}
}

// TestMirrorReadsAHintedPeerAfterItsHint: the read of a hinted peer begins
// only once its hint is applied, even while hints gather within Debounce, so
// that the read has the last word. Here the store holds the peer ready (as
// after a heal in the same generation), and the peer must end in the routes.
func TestMirrorReadsAHintedPeerAfterItsHint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &slowStore{Store: memstore.New(memstore.Config{}), gate: make(chan struct{}),
		reading: make(chan []string), changes: make(chan registry.Change, 8)}
	peers := registerReady(t, ctx, store.Store, "d0", "d1")
	d0, d1 := peers[0], peers[1]
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: -1, Debounce: 200 * time.Millisecond}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// d0's hint comes after a quiet spell and is applied at once; d1's
	// comes right after, with d1's change, and gathers.
	store.changes <- registry.Change{Stale: []registry.StaleHint{{ID: d0.ID, Generation: d0.Generation}}}
	store.changes <- registry.Change{Stale: []registry.StaleHint{{ID: d1.ID, Generation: d1.Generation}}, PeerIDs: []string{d1.ID}}
	select {
	case got := <-store.reading:
		if !slices.Equal(got, []string{d1.ID}) {
			t.Fatalf("the mirror reads %v, want d1", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mirror does not read d1")
	}
	if routable(m.Snapshot(), d1.ID) {
		t.Fatal("the mirror reads d1 before its hint took it out of the routes")
	}
	select {
	case store.gate <- struct{}{}:
	case <-time.After(5 * time.Second):
		t.Fatal("no read to answer")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !routable(m.Snapshot(), d1.ID) {
		if time.Now().After(deadline) {
			t.Fatal("d1, ready in the store, stays out of the routes after its read")
		}
		time.Sleep(time.Millisecond)
	}
}
