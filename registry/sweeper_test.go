package registry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

const sweepInterval = time.Second

// sweepFleet is a store with n ready peers, its clock and a sweeper.
type sweepFleet struct {
	clock   *registrytest.Clock
	store   *memstore.Store
	sweeper *registry.LeaseSweeper
	ids     []string
}

func newSweepFleet(t *testing.T, n int) *sweepFleet {
	t.Helper()
	f := &sweepFleet{clock: &registrytest.Clock{}}
	f.store = memstore.New(memstore.Config{Now: f.clock.Now})
	for i := 0; i < n; i++ {
		spec := registrytest.Spec(fmt.Sprintf("p%d", i), registry.RolePrefill)
		res, err := f.store.Register(context.Background(), spec, registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Heartbeat(context.Background(), registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: spec.InstanceID}); err != nil {
			t.Fatal(err)
		}
		f.ids = append(f.ids, res.Peer.ID)
	}
	return f
}

func (f *sweepFleet) startSweeper(t *testing.T) {
	t.Helper()
	var err error
	f.sweeper, err = registry.NewLeaseSweeper(registry.SweeperConfig{Interval: sweepInterval, Now: f.clock.Now},
		f.store, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
}

// sweepFor advances the clock one interval at a time for d, sweeping after
// each step as Run would, and returns how many peers the sweeps expired.
func (f *sweepFleet) sweepFor(t *testing.T, d time.Duration) int {
	t.Helper()
	total := 0
	for elapsed := time.Duration(0); elapsed < d; elapsed += sweepInterval {
		f.clock.Advance(sweepInterval)
		n, err := f.sweeper.Sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

// expectGrace sweeps for one lease TTL less an interval, requiring that the
// sweeper (named by who) expires nothing and every peer stays ready within
// its grace, then two intervals more, requiring that the n silent peers
// expire once the grace is over.
func (f *sweepFleet) expectGrace(t *testing.T, who string, n int) {
	t.Helper()
	if got := f.sweepFor(t, registry.DefaultLeaseTTL-sweepInterval); got != 0 {
		t.Fatalf("%s expired %d peers within the grace; want 0", who, got)
	}
	if st := f.states(t); st[registry.StateReady] != len(f.ids) {
		t.Fatalf("states within the grace: %v; want all %d ready", st, len(f.ids))
	}
	if got := f.sweepFor(t, 2*sweepInterval); got != n {
		t.Fatalf("after the grace %d peers expired; want the %d that never heartbeat again", got, n)
	}
}

func (f *sweepFleet) states(t *testing.T) map[registry.State]int {
	t.Helper()
	peers, err := f.store.List(context.Background(), registry.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[registry.State]int{}
	for _, p := range peers {
		out[p.State]++
	}
	return out
}

// TestSweeperGraceAfterReplicaStart: a replica that was down for longer
// than the lease TTL starts with every lease run out. Its agents could not
// heartbeat while it was down, so the new sweeper grants one TTL before it
// expires anything, and expires the peers that stay silent after that.
func TestSweeperGraceAfterReplicaStart(t *testing.T) {
	t.Parallel()
	f := newSweepFleet(t, 3)
	f.clock.Advance(3 * registry.DefaultLeaseTTL) // the replica is down
	f.startSweeper(t)
	f.expectGrace(t, "a fresh sweeper", 3)
}

// TestSweeperGraceAfterPause: a process frozen for longer than the lease
// TTL (a stopped VM, SIGSTOP) took no heartbeats; when it runs again the
// sweeper sees the gap between its sweeps and grants a grace instead of
// expiring the fleet. Peers that keep heartbeating are never touched.
func TestSweeperGraceAfterPause(t *testing.T) {
	t.Parallel()
	f := newSweepFleet(t, 2)
	f.startSweeper(t)
	if n := f.sweepFor(t, 2*sweepInterval); n != 0 { // the start grant, then a normal sweep
		t.Fatalf("expired %d", n)
	}
	f.clock.Advance(2 * registry.DefaultLeaseTTL) // frozen
	f.expectGrace(t, "a sweeper that resumed after a pause", 2)
}

// TestSweeperExpiresSilentPeers: with nothing lost, a peer that stops
// heartbeating fails one TTL after its last heartbeat and a peer that keeps
// heartbeating stays ready.
func TestSweeperExpiresSilentPeers(t *testing.T) {
	t.Parallel()
	f := newSweepFleet(t, 2)
	f.startSweeper(t)
	alive := registrytest.Spec("p0", registry.RolePrefill)
	expired := 0
	for elapsed := time.Duration(0); elapsed <= registry.DefaultLeaseTTL+2*sweepInterval; elapsed += sweepInterval {
		if _, err := f.store.Heartbeat(context.Background(), registry.Heartbeat{PeerID: f.ids[0], InstanceID: alive.InstanceID}); err != nil {
			t.Fatal(err)
		}
		expired += f.sweepFor(t, sweepInterval)
	}
	if st := f.states(t); expired != 1 || st[registry.StateReady] != 1 || st[registry.StateFailed] != 1 {
		t.Fatalf("expired %d, states %v; want the silent peer failed and the other ready", expired, st)
	}
}

func TestSweeperConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ttl, interval, pauseAfter time.Duration
	}{
		{0, time.Second, 3 * time.Second},
		{10 * time.Second, time.Second, 5 * time.Second},                   // the defaults: a second, half a lease
		{3 * time.Second, 300 * time.Millisecond, 1500 * time.Millisecond}, // a tenth of a short lease
	} {
		got := registry.SweeperConfig{LeaseTTL: tc.ttl}.WithDefaults()
		if got.Interval != tc.interval || got.PauseAfter != tc.pauseAfter {
			t.Errorf("lease %s: interval %s, pause after %s; want %s, %s", tc.ttl, got.Interval, got.PauseAfter, tc.interval, tc.pauseAfter)
		}
	}
	for _, cfg := range []registry.SweeperConfig{{Interval: -time.Second}, {Interval: time.Second, PauseAfter: time.Second}} {
		if _, err := registry.NewLeaseSweeper(cfg, memstore.New(memstore.Config{}), zerolog.Nop()); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}
