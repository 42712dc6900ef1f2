package transfer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// hangingLoads is a fake backend (the transfer library is outside this
// test's point) whose metadata loads block until release is closed; a
// preflight calls nothing else before its load returns.
type hangingLoads struct {
	transfer.Backend // nil: any other call panics
	release          chan struct{}
	loads            atomic.Int32
}

func (h *hangingLoads) AgentName() string             { return "initiator" }
func (h *hangingLoads) InvalidateRemote(string) error { return nil }
func (h *hangingLoads) LoadRemoteMetadata([]byte) (string, error) {
	h.loads.Add(1)
	<-h.release
	return "", errors.New("released")
}

// fakeProbe is probe memory that is never read: the preflights here end
// at the metadata load.
type fakeProbe struct{ n int }

func (p fakeProbe) Region() transfer.DescList {
	return transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{{Addr: 4096, Len: uint64(p.n)}}}
}
func (p fakeProbe) Len() int                { return p.n }
func (fakeProbe) WriteAt([]byte, int) error { return nil }
func (fakeProbe) ReadAt([]byte, int) error  { return nil }

// TestPreflightHangingLoadLeavesOneGoroutine: a peer whose metadata load
// never returns fails each preflight at its timeout, and the retries that
// follow fail at once: one load is left running for that peer, not one
// per retry, while another peer's preflight still gets its own load.
func TestPreflightHangingLoadLeavesOneGoroutine(t *testing.T) {
	t.Parallel()
	b := &hangingLoads{release: make(chan struct{})}
	defer close(b.release)
	cfg := transfer.PreflightConfig{MinSize: 4 << 10, MaxSize: 4 << 10, Timeout: 50 * time.Millisecond}
	local := fakeProbe{n: 8 << 10}
	peer := func(agent string) transfer.PreflightPeer {
		return transfer.PreflightPeer{Agent: agent, Metadata: []byte("md"), Region: local.Region()}
	}
	for i := range 5 {
		res := transfer.RunPreflight(context.Background(), b, local, peer("stuck"), cfg)
		var pe *transfer.PreflightError
		if !errors.As(res.Err, &pe) || pe.Stage != transfer.StageMetadata {
			t.Fatalf("preflight %d: %v, want a metadata-stage failure", i, res.Err)
		}
		if i > 0 && !strings.Contains(res.Err.Error(), "has not returned") {
			t.Fatalf("retry %d: %v, want it refused while the first load runs", i, res.Err)
		}
	}
	loadsReach(t, b, 1) // the one load, however late its goroutine ran
	transfer.RunPreflight(context.Background(), b, local, peer("other"), cfg)
	loadsReach(t, b, 2)
	if n := b.loads.Load(); n != 2 {
		t.Fatalf("%d metadata loads, want 2: one per peer", n)
	}
}

// loadsReach waits until b has started n loads.
func loadsReach(t *testing.T, b *hangingLoads, n int32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.loads.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d metadata loads started, want %d", b.loads.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
