package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
