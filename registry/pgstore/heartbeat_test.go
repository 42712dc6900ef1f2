package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// TestBadRowFailsOnlyItsHeartbeat puts rows PostgreSQL refuses (NUL and
// invalid UTF-8 in instance_id, which the field checks would have stopped
// earlier) into one batch with good heartbeats. The batch is exactly full,
// so all of them are written by one statement; only the bad rows' requests
// may fail, and every good peer must end up ready.
func TestBadRowFailsOnlyItsHeartbeat(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const good = 30
	bad := []string{"inst\x00", "\xff\xfe"}
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
		go func(inst string) {
			defer wg.Done()
			_, err := s.HeartbeatUnchecked(ctx, registry.Heartbeat{PeerID: victim.Peer.ID, InstanceID: inst})
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				errs <- fmt.Errorf("heartbeat with instance %q: %v, want the row's own error", inst, err)
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
