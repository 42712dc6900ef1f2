package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// readyFleet registers n peers and heartbeats each once: all ready.
func readyFleet(t *testing.T, ctx context.Context, s registry.Store, n int) []registry.Peer {
	t.Helper()
	peers := registerFleet(t, ctx, s, n)
	for _, p := range peers {
		if _, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
			t.Fatal(err)
		}
	}
	return peers
}

// sweepUntilOK sweeps until a sweep reaches the database again: the first
// ones after an outage may still meet pooled connections the outage broke.
func sweepUntilOK(t *testing.T, ctx context.Context, sw *registry.LeaseSweeper) int {
	t.Helper()
	for i := 0; ; i++ {
		n, err := sw.Sweep(ctx)
		if err == nil {
			return n
		}
		if !errors.Is(err, registry.ErrUnavailable) || i == 50 {
			t.Fatalf("sweep after the outage: %v", err)
		}
	}
}

// The lease TTL and sweep interval of the outage tests, on a test clock.
const outageTTL, outageInterval = 3 * time.Second, 500 * time.Millisecond

// outageContext bounds an outage test and gives it a test clock.
func outageContext(t *testing.T) (context.Context, *registrytest.Clock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx, &registrytest.Clock{}
}

// outageSweeper is a lease sweeper over s that sweeps every outageInterval
// of clock.
func outageSweeper(t *testing.T, clock *registrytest.Clock, s registry.Store) *registry.LeaseSweeper {
	t.Helper()
	sw, err := registry.NewLeaseSweeper(registry.SweeperConfig{Interval: outageInterval, Now: clock.Now}, s, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	return sw
}

// TestLeasesSurviveStoreOutage is issue 11's first failure: PostgreSQL away
// for longer than the lease TTL, then back. Every heartbeat in between
// failed with ErrUnavailable (the HTTP edge answers 503), so the lapsed
// leases say nothing about the peers: the first sweep that reaches the
// database again grants a grace of one TTL, and only peers that stay silent
// after it fail.
func TestLeasesSurviveStoreOutage(t *testing.T) {
	t.Parallel()
	ctx, clock := outageContext(t)
	s, outage, _ := registrytest.NewPGStoreWithOutage(t, pgstore.Config{LeaseTTL: outageTTL, Now: clock.Now})
	peers := readyFleet(t, ctx, s, 10)
	sw := outageSweeper(t, clock, s)
	if n := sweepUntilOK(t, ctx, sw); n != 0 {
		t.Fatalf("first sweep expired %d", n)
	}

	outage.Cut()
	for elapsed := time.Duration(0); elapsed < 3*outageTTL; elapsed += outageInterval {
		clock.Advance(outageInterval)
		if _, err := sw.Sweep(ctx); !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("sweep during the outage: %v, want ErrUnavailable", err)
		}
	}
	_, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: peers[0].ID, InstanceID: peers[0].InstanceID})
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("heartbeat during the outage: %v, want ErrUnavailable", err)
	}
	if _, err := s.List(ctx, registry.Filter{}); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("list during the outage: %v, want ErrUnavailable", err)
	}
	if _, err := s.Register(ctx, registrytest.Spec("late", registry.RoleDecode), registry.Claim{Admin: true}); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("register during the outage: %v, want ErrUnavailable", err)
	}

	outage.Restore()
	if n := sweepUntilOK(t, ctx, sw); n != 0 {
		t.Fatalf("the first sweep after the outage expired %d peers; want a grace", n)
	}
	for elapsed := outageInterval; elapsed < outageTTL; elapsed += outageInterval {
		clock.Advance(outageInterval)
		if n, err := sw.Sweep(ctx); err != nil || n != 0 {
			t.Fatalf("sweep %s into the grace: %d expired, %v", elapsed, n, err)
		}
	}
	all, err := s.List(ctx, registry.Filter{State: registry.StateReady})
	if err != nil || len(all) != len(peers) {
		t.Fatalf("ready peers at the end of the grace: %d (%v), want %d", len(all), err, len(peers))
	}
	// The grace is one TTL, not an amnesty: peers whose agents stay
	// silent after it fail.
	expired := 0
	for i := 0; i < 3; i++ {
		clock.Advance(outageInterval)
		n, err := sw.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		expired += n
	}
	if expired != len(peers) {
		t.Fatalf("after the grace %d peers expired, want %d", expired, len(peers))
	}
}

// TestOutageOfOneReplica: two replicas share the database; one loses it
// (a network partition of its own). The other keeps sweeping, and the
// peers whose agents moved over to it stay alive; the partitioned replica
// answers ErrUnavailable, and its grace once it reaches the database again
// touches only live leases.
func TestOutageOfOneReplica(t *testing.T) {
	t.Parallel()
	ctx, clock := outageContext(t)
	a, outage, cfg := registrytest.NewPGStoreWithOutage(t, pgstore.Config{LeaseTTL: outageTTL, Now: clock.Now})
	b := registrytest.OpenPGStore(t, cfg)
	peers := readyFleet(t, ctx, b, 2)
	swA, swB := outageSweeper(t, clock, a), outageSweeper(t, clock, b)
	sweepUntilOK(t, ctx, swA)
	sweepUntilOK(t, ctx, swB)

	outage.Cut()
	silent := peers[0] // its agent reaches no working replica
	expired := 0
	for elapsed := time.Duration(0); elapsed < 2*outageTTL; elapsed += outageInterval {
		clock.Advance(outageInterval)
		for _, p := range peers[1:] { // these agents fail over to b
			if _, err := b.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := swA.Sweep(ctx); !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("partitioned replica's sweep: %v, want ErrUnavailable", err)
		}
		n, err := swB.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		expired += n
	}
	if expired != 1 {
		t.Fatalf("the healthy replica expired %d peers; want only the silent one", expired)
	}
	outage.Restore()
	sweepUntilOK(t, ctx, swA)
	got, err := b.Get(ctx, silent.ID)
	if err != nil || got.State != registry.StateFailed {
		t.Fatalf("silent peer after the partition healed: %s, %v; the grace must not revive it", got.State, err)
	}
	ready, err := b.List(ctx, registry.Filter{State: registry.StateReady})
	if err != nil || len(ready) != len(peers)-1 {
		t.Fatalf("ready peers: %d, %v; want %d", len(ready), err, len(peers)-1)
	}
}

// TestMirrorResyncsAfterOutage: while a replica is cut off its database,
// another replica changes a peer; the notification is lost to the first.
// Its routing snapshot keeps serving the old state meanwhile, and once the
// database is back its listener reconnects and the snapshot reloads.
func TestMirrorResyncsAfterOutage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, outage, cfg := registrytest.NewPGStoreWithOutage(t, pgstore.Config{})
	b := registrytest.OpenPGStore(t, cfg)
	mirrorA := replica.NewMirror(replica.MirrorConfig{}, a, zerolog.New(zerolog.NewTestWriter(t)))
	if err := mirrorA.Start(ctx); err != nil {
		t.Fatal(err)
	}
	snaps := mirrorA.Watch(ctx)
	peers := readyFleet(t, ctx, b, 2)
	for _, p := range peers {
		waitState(t, ctx, mirrorA, snaps, p.ID, registry.StateReady)
	}

	outage.Cut()
	if _, err := b.MarkStale(ctx, peers[0].ID, "changed while a was away", ""); err != nil {
		t.Fatal(err)
	}
	if p, _ := mirrorA.Snapshot().Peer(peers[0].ID); p.State != registry.StateReady {
		t.Fatalf("the cut-off replica saw the change: %s", p.State)
	}
	outage.Restore()
	waitState(t, ctx, mirrorA, snaps, peers[0].ID, registry.StateStale)
}

// TestTerminatedConnectionsAreUnavailable: PostgreSQL ends the store's
// connections (pg_terminate_backend: SQLSTATE 57P01 admin_shutdown, what
// `pg_ctl stop -m fast` sends every backend). A call that meets one is
// ErrUnavailable (a 503 at the edge), never an internal error, and the
// store works again on fresh connections.
func TestTerminatedConnectionsAreUnavailable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL, app := taggedSchema(t)
	s := registrytest.OpenPGStore(t, pgstore.Config{URL: dbURL, Channel: app, Migrate: true})
	readyFleet(t, ctx, s, 2)
	killed := terminateBackends(t, ctx, app)
	if killed == 0 {
		t.Fatal("terminate the store's connections: none found")
	}
	sawUnavailable := false
	for i := 0; i < 20; i++ { // each failing call costs the pool one dead connection
		_, err := s.List(ctx, registry.Filter{})
		if err == nil {
			break
		}
		if !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("list on a terminated connection: %v, want ErrUnavailable", err)
		}
		sawUnavailable = true
	}
	t.Logf("terminated %d connections; a call met one: %v", killed, sawUnavailable)
	if !sawUnavailable {
		t.Fatal("no call met a terminated connection; the test did not test anything")
	}
	if _, err := s.List(ctx, registry.Filter{}); err != nil {
		t.Fatalf("the store did not recover: %v", err)
	}
}

// TestUnreachableDatabaseHostIsUnavailable: the database's host stops
// answering (new connections are accepted by nothing and never answered)
// and PostgreSQL ends the connections the store had. A call then fails as
// ErrUnavailable after the connect timeout instead of hanging on the dial.
func TestUnreachableDatabaseHostIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL, app := taggedSchema(t)
	outage, viaURL := registrytest.NewOutage(t, dbURL)
	const connectTimeout = 300 * time.Millisecond
	s := registrytest.OpenPGStore(t, pgstore.Config{URL: viaURL, Channel: app, Migrate: true, ConnectTimeout: connectTimeout})
	readyFleet(t, ctx, s, 1)
	outage.Stall()
	terminateBackends(t, ctx, app)
	for i := 0; ; i++ { // calls that meet a terminated connection fail at once; then the dial
		start := time.Now()
		_, err := s.List(ctx, registry.Filter{})
		if !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("list with the database host unreachable: %v, want ErrUnavailable", err)
		}
		if took := time.Since(start); took >= connectTimeout {
			t.Logf("a call on a new connection failed as unavailable after %s", took)
			if took > 10*connectTimeout {
				t.Fatalf("the call took %s; the connect timeout is %s", took, connectTimeout)
			}
			break
		}
		if i == 20 {
			t.Fatal("no call tried a new connection")
		}
	}
	outage.Restore()
	if _, err := s.List(ctx, registry.Filter{}); err != nil {
		t.Fatalf("the store did not recover: %v", err)
	}
}

// taggedSchema makes a fresh schema and returns its URL, which names app
// (also the schema's notification channel) as its connections'
// application_name, so that terminateBackends can find them.
func taggedSchema(t *testing.T) (dbURL, app string) {
	t.Helper()
	dbURL, schema := registrytest.NewSchema(t)
	app = "pdplane_" + schema
	return dbURL + "&application_name=" + app, app
}

// terminateBackends ends every connection of application app, as
// PostgreSQL's administrator (or a fast shutdown) does, and returns how many
// it ended.
func terminateBackends(t *testing.T, ctx context.Context, app string) int {
	t.Helper()
	admin, err := pgxpool.New(ctx, registrytest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var killed int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, app).Scan(&killed); err != nil {
		t.Fatalf("terminate the connections of %s: %v", app, err)
	}
	return killed
}
