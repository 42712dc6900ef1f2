package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// TestBadRowFailsOnlyItsHeartbeat puts rows PostgreSQL refuses (NUL and
// invalid UTF-8 in the error text of a probe that failed, which the event
// of the peer's move to unhealthy carries, and which the field checks
// would have stopped earlier) into one batch with good heartbeats. The batch is exactly full,
// so all of them are written by one statement; only the bad rows' requests
// may fail, and every good peer must end up ready.
func TestBadRowFailsOnlyItsHeartbeat(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const good = 30
	bad := []string{"probe\x00", "\xff\xfe"}
	// A linger far longer than the test and one writer: the batch is
	// written when full.
	s, _ := registrytest.NewPGStore(t, pgstore.Config{HeartbeatBatch: good + len(bad), HeartbeatLinger: time.Minute, HeartbeatWriters: 1})
	victim, err := s.Register(ctx, registrytest.Spec("victim", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	peers := registerFleet(t, ctx, s, good)

	var wg sync.WaitGroup
	errs := make(chan error, good+len(bad))
	for _, inst := range bad {
		wg.Add(1)
		go func(text string) {
			defer wg.Done()
			_, err := s.HeartbeatUnchecked(ctx, registry.Heartbeat{PeerID: victim.Peer.ID, InstanceID: victim.Peer.InstanceID, EngineDown: true, EngineError: text})
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				errs <- fmt.Errorf("heartbeat with engine error %q: %v, want the row's own error", text, err)
			}
		}(inst)
	}
	for _, p := range peers {
		wg.Add(1)
		go func(p registry.Peer) {
			defer wg.Done()
			r, err := s.HeartbeatUnchecked(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID})
			if err == nil && r.State != registry.StateReady {
				err = fmt.Errorf("reply %+v", r)
			}
			if err != nil {
				errs <- fmt.Errorf("good heartbeat of %s in a batch with bad rows: %w", p.Name, err)
			}
		}(p)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ready, err := s.List(ctx, registry.Filter{State: registry.StateReady})
	if err != nil || len(ready) != good {
		t.Fatalf("ready peers: %d, %v; want %d", len(ready), err, good)
	}
	if v, err := s.Get(ctx, victim.Peer.ID); err != nil || v.State != registry.StatePending {
		t.Fatalf("victim: %s, %v; want it still pending", v.State, err)
	}
}

// TestUnreadableHealPlanFailsNoOtherPeer: a stale peer whose stored heal
// plan cannot be read (a damaged row) heartbeats in one batch with good
// peers; every good heartbeat is answered, the damaged peer's too (its
// heal starts over), and the lease sweep, which reads heal plans as well,
// still runs.
func TestUnreadableHealPlanFailsNoOtherPeer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const good = 10
	s, cfg := registrytest.NewPGStore(t, pgstore.Config{HeartbeatBatch: good + 1, HeartbeatLinger: time.Minute, HeartbeatWriters: 1})
	damaged, err := s.Register(ctx, registrytest.Spec("damaged", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	peers := registerFleet(t, ctx, s, good)
	if _, err := s.MarkStale(ctx, damaged.Peer.ID, "test", ""); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `UPDATE peers SET heal = '{"phase": 7}' WHERE id = $1`, damaged.Peer.ID); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, good+1)
	for _, p := range append(peers, damaged.Peer) {
		wg.Go(func() {
			if _, err := s.HeartbeatUnchecked(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
				errs <- fmt.Errorf("heartbeat of %s in a batch with an unreadable heal plan: %w", p.Name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A plan the sweep selects (on hold) but cannot read.
	if _, err := pool.Exec(ctx, `UPDATE peers SET heal = '{"phase": "quarantined", "deadline": 7}' WHERE id = $1`, damaged.Peer.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExpireLeases(ctx, time.Now()); err != nil {
		t.Fatalf("lease sweep with an unreadable heal plan: %v", err)
	}
}

// TestHeldRowDelaysNoOtherHeartbeat re-runs the reliability core's lock
// finding: another database connection holds one peer's row (SELECT … FOR
// UPDATE) for longer than a lease while the fleet heartbeats and the lease
// sweeper runs. The other peers' heartbeats are answered as ever (they
// used to wait in the same batch for the whole hold, and their leases ran
// out); no peer expires, the one whose row is held included: its
// heartbeat waits for the row and lands as soon as it is free.
func TestHeldRowDelaysNoOtherHeartbeat(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const lease, hold, every = 2 * time.Second, 3 * time.Second, 100 * time.Millisecond
	s, cfg := registrytest.NewPGStore(t, pgstore.Config{LeaseTTL: lease})
	peers := registerFleet(t, ctx, s, 40)
	for _, p := range peers {
		if _, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
			t.Fatal(err)
		}
	}
	victim := peers[17]

	conn, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM peers WHERE id = $1 FOR UPDATE", victim.ID); err != nil {
		t.Fatal(err)
	}
	released := time.Now().Add(hold)

	var wg sync.WaitGroup
	var worst atomic.Int64 // the slowest heartbeat of a peer whose row is free, ns
	victimDone := make(chan time.Time, 1)
	stop := make(chan struct{})
	for _, p := range peers {
		wg.Go(func() {
			for {
				start := time.Now()
				_, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID})
				took := time.Since(start)
				if p.ID == victim.ID {
					if err == nil && time.Now().After(released) {
						victimDone <- time.Now()
						return
					}
				} else {
					if err != nil {
						t.Errorf("heartbeat of %s: %v", p.Name, err)
						return
					}
					for w := worst.Load(); int64(took) > w && !worst.CompareAndSwap(w, int64(took)); w = worst.Load() {
					}
				}
				select {
				case <-stop:
					return
				case <-time.After(every): // a fleet's pace, as agents heartbeat
				}
			}
		})
	}
	wg.Go(func() { // the lease sweeper, as often as it runs
		for {
			if _, err := s.ExpireLeases(ctx, time.Now()); err != nil {
				t.Errorf("sweep: %v", err)
			}
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	})
	time.Sleep(time.Until(released)) // the hold is the scenario's, not a wait for an event
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-victimDone:
		if d := at.Sub(released); d > time.Second {
			t.Errorf("the held peer's heartbeat landed %v after its row was free", d)
		}
	case <-time.After(10 * time.Second):
		t.Error("the held peer's heartbeat never landed")
	}
	close(stop)
	wg.Wait()
	if w := time.Duration(worst.Load()); w > lease/2 {
		t.Errorf("a heartbeat of a peer whose row was free took %v while another row was held", w)
	}
	failed, err := s.List(ctx, registry.Filter{State: registry.StateFailed})
	if err != nil || len(failed) != 0 {
		t.Fatalf("%d peers expired (%v), want none: every one was heartbeating", len(failed), err)
	}
}

// TestHeldHealRowDelaysNoSweep: another connection holds the row of a
// decode whose quarantined-phase hold is over (a row the sweep's heal pass
// selects and would lock). The lease sweep skips it rather than wait for
// it, as it skips held rows whose lease ran out, and still drains the
// other decode whose hold is over.
func TestHeldHealRowDelaysNoSweep(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, cfg := registrytest.NewPGStore(t, pgstore.Config{})
	peers := registerFleet(t, ctx, s, 2)
	held, free := peers[0], peers[1]
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `UPDATE peers SET heal = '{"phase": "quarantined", "deadline": "2000-01-01T00:00:00Z"}' WHERE id = ANY($1::text[]::uuid[])`,
		[]string{held.ID, free.ID}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM peers WHERE id = $1 FOR UPDATE", held.ID); err != nil {
		t.Fatal(err)
	}
	sweepCtx, sweepCancel := context.WithTimeout(ctx, 5*time.Second)
	defer sweepCancel()
	n, err := s.ExpireLeases(sweepCtx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("lease sweep with a held heal row: %d changed, %v; want the free decode's hold ended at once", n, err)
	}
	if p, err := s.Get(ctx, free.ID); err != nil || p.Heal.Phase == registry.HealQuarantined {
		t.Fatalf("free decode: heal %q, %v; want its hold over", p.Heal.Phase, err)
	}
}
