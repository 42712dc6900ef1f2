package transfer_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

func dl(descs ...transfer.Desc) transfer.DescList {
	return transfer.DescList{Kind: registry.DRAM, Descs: descs}
}

func TestRegionSet(t *testing.T) {
	t.Parallel()
	var s transfer.RegionSet
	if err := s.Add(dl(transfer.Desc{Addr: 0x1000, Len: 0x1000}, transfer.Desc{Addr: 0x4000, Len: 0x1000})); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"inside", s.Contains(dl(transfer.Desc{Addr: 0x1800, Len: 0x800})), nil},
		{"whole region", s.Contains(dl(transfer.Desc{Addr: 0x4000, Len: 0x1000})), nil},
		{"straddles the end", s.Contains(dl(transfer.Desc{Addr: 0x1800, Len: 0x1000})), transfer.ErrOutOfRange},
		{"between regions", s.Contains(dl(transfer.Desc{Addr: 0x2000, Len: 1})), transfer.ErrOutOfRange},
		{"before all", s.Contains(dl(transfer.Desc{Addr: 0x10, Len: 1})), transfer.ErrOutOfRange},
		{"wraps around", s.Contains(dl(transfer.Desc{Addr: 0x1800, Len: ^uint64(0)})), transfer.ErrOutOfRange},
		{"other kind", s.Contains(transfer.DescList{Kind: registry.VRAM, Descs: []transfer.Desc{{Addr: 0x1800, Len: 1}}}), transfer.ErrOutOfRange},
		{"zero length", s.Add(dl(transfer.Desc{Addr: 0x9000, Len: 0})), transfer.ErrInvalidRegion},
		{"address zero", s.Add(dl(transfer.Desc{Addr: 0, Len: 16})), transfer.ErrInvalidRegion},
		{"overlaps registered", s.Add(dl(transfer.Desc{Addr: 0x1fff, Len: 2})), transfer.ErrOverlap},
		{"overlaps itself", s.Add(dl(transfer.Desc{Addr: 0x9000, Len: 0x100}, transfer.Desc{Addr: 0x90ff, Len: 0x100})), transfer.ErrOverlap},
		{"adjacent is fine", s.Add(dl(transfer.Desc{Addr: 0x2000, Len: 0x1000})), nil},
		{"remove unknown", s.Remove(dl(transfer.Desc{Addr: 0x1000, Len: 0x800})), transfer.ErrInvalidRegion},
		{"remove exact", s.Remove(dl(transfer.Desc{Addr: 0x1000, Len: 0x1000})), nil},
		{"removed is gone", s.Contains(dl(transfer.Desc{Addr: 0x1800, Len: 1})), transfer.ErrOutOfRange},
	}
	for _, tc := range cases {
		if tc.want == nil && tc.err != nil || tc.want != nil && !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

// TestRegionGuardDeregisterWaits: deregistration waits for transfers that
// already hold memory, and new transfers are refused at once, not blocked.
func TestRegionGuardDeregisterWaits(t *testing.T) {
	t.Parallel()
	var g transfer.RegionGuard
	r := dl(transfer.Desc{Addr: 0x1000, Len: 0x1000})
	if err := g.Register(r); err != nil {
		t.Fatal(err)
	}
	acc, err := g.Acquire(r)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	deregistered := make(chan struct{})
	wg.Go(func() {
		if err := g.Deregister(r); err != nil {
			t.Error(err)
		}
		close(deregistered)
	})
	// Wait until the region is gone from the set (new acquisitions fail).
	deadline := time.Now().Add(5 * time.Second)
	for g.Contains(r) == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, err := g.Acquire(r); !errors.Is(err, transfer.ErrOutOfRange) {
		t.Fatalf("acquire during deregistration: %v", err)
	}
	select {
	case <-deregistered:
		t.Fatal("deregistration did not wait for the transfer")
	case <-time.After(20 * time.Millisecond):
	}
	g.Release(acc)
	wg.Wait()
}

func TestHostBuffer(t *testing.T) {
	t.Parallel()
	h, err := transfer.AllocHost(3 << 12)
	if err != nil {
		t.Fatal(err)
	}
	if h.Addr()%4096 != 0 || h.Len() != 3<<12 {
		t.Fatalf("addr %#x len %d", h.Addr(), h.Len())
	}
	copy(h.Bytes()[100:], "hello")
	if got := string(transfer.HostBytes(h.Addr()+100, 5)); got != "hello" {
		t.Fatalf("HostBytes read %q", got)
	}
	if err := h.Free(); err != nil {
		t.Fatal(err)
	}
	if err := h.Free(); err != nil {
		t.Fatal(err)
	}
	if _, err := transfer.AllocHost(0); !errors.Is(err, transfer.ErrInvalidRegion) {
		t.Fatalf("zero-size buffer: %v", err)
	}
}

func TestSelectPairs(t *testing.T) {
	t.Parallel()
	local := dl(transfer.Desc{Addr: 0x1000, Len: 16}, transfer.Desc{Addr: 0x1010, Len: 16}, transfer.Desc{Addr: 0x1020, Len: 16})
	remote := dl(transfer.Desc{Addr: 0x9000, Len: 16}, transfer.Desc{Addr: 0x9010, Len: 16}, transfer.Desc{Addr: 0x9020, Len: 16})
	l, r, err := transfer.SelectPairs(local, remote, []int{0, 1, 2}, []int{0, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Descs) != 2 || l.Descs[0].Len != 32 || r.Descs[1].Addr != 0x9000 {
		t.Fatalf("merged %+v %+v", l, r)
	}
	if _, _, err := transfer.SelectPairs(local, remote, []int{3}, []int{0}); !errors.Is(err, transfer.ErrOutOfRange) {
		t.Fatalf("index past the list: %v", err)
	}
	if _, _, err := transfer.SelectPairs(local, remote, []int{0}, nil); !errors.Is(err, transfer.ErrInvalidDescs) {
		t.Fatalf("unequal indices: %v", err)
	}
}
