package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// TestUpdateKeepsItsConnection runs single-peer updates and transfer
// failure reports, which manage their transaction by hand (BEGIN sent with
// the locked reads, COMMIT with the writes), one after another: a peer
// that is not there is rolled back rather than left open, so the pool
// keeps serving them on the connection it has (it opens no other), outside
// any transaction, and the writes take effect.
func TestUpdateKeepsItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, _ := registrytest.NewPGStore(t, pgstore.Config{MaxConns: 1})
	res, err := s.Register(ctx, registrytest.Spec("d0", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Peer.ID
	if _, err := s.PooledTxStatus(ctx); err != nil {
		t.Fatal(err)
	}
	opened := s.ConnsOpened()
	const missing = "00000000-0000-4000-8000-000000000000"
	for range 3 {
		if _, err := s.MarkStale(ctx, missing, "test: gone", ""); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("mark stale a peer that is not there: %v, want ErrNotFound", err)
		}
		if _, err := s.Drain(ctx, missing); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("drain a peer that is not there: %v, want ErrNotFound", err)
		}
		// The decode is locked before the prefill is found missing.
		_, _, err := s.ReportTransferFailure(ctx, registry.TransferFailure{DecodeID: id, PrefillID: missing,
			Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind", Reporter: "test"})
		if !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("report a failure from a prefill that is not there: %v, want ErrNotFound", err)
		}
	}
	p, err := s.MarkStale(ctx, id, "test: transfer failed", "Missing NIXL destination KV memory kind")
	if err != nil {
		t.Fatal(err)
	}
	if p.State != registry.StateStale {
		t.Fatalf("state %s after a stale mark, want stale", p.State)
	}
	got, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != registry.StateStale || got.StateReason != p.StateReason {
		t.Fatalf("stored %s (%q), answered %s (%q)", got.State, got.StateReason, p.State, p.StateReason)
	}
	status, err := s.PooledTxStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.ConnsOpened(); n != opened || status != 'I' {
		t.Fatalf("%d connections opened and transaction status %q after the updates, want %d (none replaced) and I (none open)", n, status, opened)
	}
}
