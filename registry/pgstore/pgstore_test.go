package pgstore_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// controlPlane is one control-plane replica: its own store (pool +
// listener) and mirror over the shared database.
type controlPlane struct {
	store  *pgstore.Store
	mirror *replica.Mirror
}

func startReplica(t testing.TB, ctx context.Context, cfg pgstore.Config) controlPlane {
	t.Helper()
	s := registrytest.OpenPGStore(t, cfg)
	m := replica.NewMirror(replica.MirrorConfig{}, s, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return controlPlane{store: s, mirror: m}
}

// waitState waits on the mirror's snapshots until peer id has state st and
// returns when that snapshot arrived.
func waitState(t testing.TB, ctx context.Context, m *replica.Mirror, snaps <-chan *replica.Snapshot, id string, st registry.State) time.Time {
	t.Helper()
	if p, ok := m.Snapshot().Peer(id); ok && p.State == st {
		return time.Now()
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case s := <-snaps:
			if p, ok := s.Peer(id); ok && p.State == st {
				return time.Now()
			}
		case <-deadline:
			t.Fatalf("peer %s did not become %s on the other replica", id, st)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// TestStaleReachesOtherReplica marks a decode stale through replica A and
// measures how long replica B's routing snapshot takes to drop it.
func TestStaleReachesOtherReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Twenty stale marks in a row: past the heal limit a peer fails
	// instead, which is not what this measures.
	_, cfg := registrytest.NewPGStore(t, pgstore.Config{Heal: registry.HealConfig{MaxPerHour: 1000}})
	a, b := startReplica(t, ctx, cfg), startReplica(t, ctx, cfg)
	snapsB := b.mirror.Watch(ctx)

	pf := registrytest.Spec("p0", registry.RolePrefill)
	dspec := registrytest.Spec("d0", registry.RoleDecode)
	var d registry.Peer
	for _, spec := range []registry.PeerSpec{pf, dspec} {
		res, err := a.store.Register(ctx, spec, registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.store.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: spec.InstanceID}); err != nil {
			t.Fatal(err)
		}
		d = res.Peer
	}
	waitState(t, ctx, b.mirror, snapsB, d.ID, registry.StateReady)

	const rounds = 20
	var lat []time.Duration
	for i := 0; i < rounds; i++ {
		start := time.Now()
		if _, err := a.store.MarkStale(ctx, d.ID, "transfer failed", "Missing NIXL destination KV memory kind"); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, waitState(t, ctx, b.mirror, snapsB, d.ID, registry.StateStale).Sub(start))
		if routes := b.mirror.Snapshot().Routes("m"); routes != nil && len(routes.DecodesFor(routes.Prefills[0].ID)) != 0 {
			t.Fatalf("replica B still routes to the stale decode")
		}
		dspec.Ranks[0].AgentName = fmt.Sprintf("d0-agent-gen%d", i+2)
		if _, err := a.store.Register(ctx, dspec, registry.Claim{Admin: true}); err != nil {
			t.Fatal(err)
		}
		waitState(t, ctx, b.mirror, snapsB, d.ID, registry.StateReady)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("stale mark on replica A → dropped from replica B's snapshot: p50 %v, max %v over %d rounds",
		lat[len(lat)/2], lat[len(lat)-1], rounds)
	if lat[len(lat)/2] > time.Second {
		t.Fatalf("stale propagation p50 %v: the notification path is broken, not just slow", lat[len(lat)/2])
	}
}

// TestRestartKeepsPeers pins that peers survive the store going away: a new
// store on the same database sees everything.
func TestRestartKeepsPeers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s1, cfg := registrytest.NewPGStore(t, pgstore.Config{})
	for _, spec := range registrytest.Fleet(3) {
		if _, err := s1.Register(ctx, spec, registry.Claim{Admin: true}); err != nil {
			t.Fatal(err)
		}
	}
	s1.Close()
	s2 := registrytest.OpenPGStore(t, cfg)
	peers, err := s2.List(ctx, registry.Filter{})
	if err != nil || len(peers) != 6 {
		t.Fatalf("after reopening: %d peers, %v; want 6", len(peers), err)
	}
}

// registerFleet registers n peers concurrently and returns them.
func registerFleet(tb testing.TB, ctx context.Context, s registry.Store, n int) []registry.Peer {
	peers := make([]registry.Peer, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				res, err := s.Register(ctx, registrytest.Spec(fmt.Sprintf("peer-%05d", i), registry.RoleDecode), registry.Claim{Admin: true})
				if err != nil {
					errs <- err
					return
				}
				peers[i] = res.Peer
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return peers
}

// BenchmarkHeartbeatThroughput measures batched heartbeat rows per second
// in a fleet's steady state: 1,024 × GOMAXPROCS concurrent callers (2,048
// on two cores) over 10,000 peers, after every peer has heartbeated once.
// The first pass is left out of the timing because it is not what a
// running fleet repeats: the store's first batches plan their statement
// afresh (PostgreSQL plans a prepared statement's first five executions
// one by one) and every row is updated for the first time since it was
// inserted.
func BenchmarkHeartbeatThroughput(b *testing.B) {
	ctx := context.Background()
	s, _ := registrytest.NewPGStore(b, pgstore.Config{})
	peers := registerFleet(b, ctx, s, 10_000)
	warmUp(b, s, peers)
	b.ResetTimer()
	driveHeartbeats(b, s, peers)
}

// warmUp sends every peer's first heartbeat, 1,024 at a time.
func warmUp(tb testing.TB, s registry.Store, peers []registry.Peer) {
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	sem := make(chan struct{}, 1024)
	for _, p := range peers {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := s.Heartbeat(context.Background(), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		tb.Fatal(err)
	default:
	}
}

// driveHeartbeats sends b.N heartbeats from 1,024 × GOMAXPROCS callers,
// round robin over peers, and reports rows/s.
func driveHeartbeats(b *testing.B, s registry.Store, peers []registry.Peer) {
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(1024) // 1024 × GOMAXPROCS callers, like a large fleet
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := peers[int(next.Add(1))%len(peers)]
			if _, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkHeartbeatUnbatched is the baseline for BenchmarkHeartbeatThroughput:
// the same callers, each heartbeat its own single-row UPDATE on the pool.
func BenchmarkHeartbeatUnbatched(b *testing.B) {
	ctx := context.Background()
	s, cfg := registrytest.NewPGStore(b, pgstore.Config{})
	peers := registerFleet(b, ctx, s, 10_000)
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	b.ResetTimer()
	var next atomic.Int64
	b.SetParallelism(1024)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := peers[int(next.Add(1))%len(peers)]
			if _, err := pool.Exec(ctx, `UPDATE peers SET last_heartbeat = now(), lease_expiry = now() + interval '10 seconds',
				load_running = $2 WHERE id = $1`, p.ID, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkFleet10kEvery2s runs the fleet the registry is sized for: 10,000
// peers each heartbeating every 2 s (5,000 heartbeats/s) for 10 s, and
// reports the achieved rate and the heartbeat latency percentiles. It does
// not depend on b.N.
func BenchmarkFleet10kEvery2s(b *testing.B) {
	const peersN, interval, duration = 10_000, 2 * time.Second, 10 * time.Second
	ctx := context.Background()
	s, _ := registrytest.NewPGStore(b, pgstore.Config{})
	peers := registerFleet(b, ctx, s, peersN)
	for range b.N {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		stop := time.Now().Add(duration)
		start := time.Now()
		for i, p := range peers {
			wg.Add(1)
			go func(p registry.Peer, offset time.Duration) {
				defer wg.Done()
				local := make([]time.Duration, 0, 8)
				// The fleet spread over the interval, each peer on its beat.
				for t := start.Add(offset); t.Before(stop); t = t.Add(interval) {
					time.Sleep(time.Until(t)) // the load's pace, not a wait for an event
					t0 := time.Now()
					if _, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
						b.Error(err)
						return
					}
					local = append(local, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			}(p, time.Duration(i)*interval/peersN)
		}
		wg.Wait()
		elapsed := time.Since(start)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "heartbeats/s")
		b.ReportMetric(float64(peersN)/interval.Seconds(), "target/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}

func TestHealExpiry(t *testing.T) {
	t.Parallel()
	const verify = time.Minute
	s, _ := registrytest.NewPGStore(t, pgstore.Config{LeaseTTL: time.Hour, Heal: registry.HealConfig{VerifyTimeout: verify}})
	registrytest.HealExpiry(t, s, verify)
}

// TestHoldEndsOnHeartbeat: see registrytest.CheckHoldEndsOnHeartbeat; here
// through the heartbeat batch statement.
func TestHoldEndsOnHeartbeat(t *testing.T) {
	t.Parallel()
	var clock registrytest.Clock
	s, _ := registrytest.NewPGStore(t, pgstore.Config{Now: clock.Now, Heal: registrytest.Heal})
	registrytest.CheckHoldEndsOnHeartbeat(t, s, &clock)
}
