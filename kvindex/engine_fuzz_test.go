package kvindex

import (
	"math/rand/v2"
	"testing"

	"github.com/pdplane/pdplane/kvevents"
)

// bytesIn hands out a fuzzer's bytes, then zeros.
type bytesIn []byte

func (b *bytesIn) next(n int) int {
	if len(*b) == 0 {
		return 0
	}
	v := (*b)[0]
	*b = (*b)[1:]
	return int(v) % n
}

// publisher turns bytes into the batches of a misbehaving engine: hashes
// from a small set (stored twice, removed unstored, reused for other
// tokens), parents known and unknown, several media, and clears if asked.
func publisher(in *bytesIn, clears bool) kvevents.Batch {
	media := []string{"GPU", "CPU", "", "STORAGE"}
	var evs []kvevents.Event
	for range 1 + in.next(4) {
		n := 1 + in.next(4)
		hashes := make([]kvevents.Hash, n)
		for i := range hashes {
			hashes[i] = h(in.next(48))
		}
		ev := kvevents.Event{BlockHashes: hashes, Medium: media[in.next(len(media))], BlockSize: bs}
		switch op := in.next(16); {
		case op < 8:
			ev.Kind = kvevents.BlockStored
			if in.next(3) > 0 {
				ev.ParentHash = h(in.next(48))
			}
			ev.TokenIDs = make([]int32, n*bs)
			for i := range ev.TokenIDs {
				ev.TokenIDs[i] = int32(in.next(3))
			}
		case op < 10:
			ev.Kind = kvevents.BlockStored // a copy to another medium
		case op < 15 || !clears:
			ev.Kind = kvevents.BlockRemoved
		default:
			ev = kvevents.Event{Kind: kvevents.AllBlocksCleared}
		}
		evs = append(evs, ev)
	}
	return kvevents.Batch{Events: evs}
}

// checkBounded holds the engine to its cap, and its order to its blocks.
func checkBounded(t *testing.T, e *Engine) {
	t.Helper()
	checkInvariants(t, e)
	if len(e.blocks) > e.max {
		t.Fatalf("%d blocks, past the cap of %d", len(e.blocks), e.max)
	}
	if n := len(e.held.Load().slots); n > max(16, 3*e.max) {
		t.Fatalf("a key set of %d slots for a cap of %d", n, e.max)
	}
	if n := len(e.order.ids); n > 2*e.max+minOrder+4 {
		t.Fatalf("the order holds %d entries for a cap of %d", n, e.max)
	}
	live := 0
	for i := e.order.head; i < len(e.order.ids); i++ {
		if b, ok := e.blocks[e.order.ids[i]]; ok && b.seq == e.order.base+uint32(i) {
			live++
		}
	}
	if live != len(e.blocks) {
		t.Fatalf("%d blocks, %d of them in the order", len(e.blocks), live)
	}
}

func FuzzApply(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		seed := make([]byte, 512)
		for i := range seed {
			seed[i] = byte(r.Uint32())
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e := newEngine(Config{MaxBlocks: 8})
		in := bytesIn(data)
		for len(in) > 0 {
			if err := e.Apply(publisher(&in, true)); err != nil {
				t.Fatal(err)
			}
			checkBounded(t, e)
		}
	})
}

// TestRandomEventsStayWithinCap runs the fuzzer's publisher, without
// clears, long enough for the order to compact many times.
func TestRandomEventsStayWithinCap(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 1<<18)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	e := newEngine(Config{MaxBlocks: 8})
	in := bytesIn(data)
	for i := 0; len(in) > 0; i++ {
		if err := e.Apply(publisher(&in, false)); err != nil {
			t.Fatal(err)
		}
		if i%64 == 0 {
			checkBounded(t, e)
		}
	}
	checkBounded(t, e)
	if s := e.Stats(); s.Evicted == 0 || s.Unkeyed == 0 {
		t.Fatalf("Stats %+v: the publisher never reached the cap or an unknown parent", s)
	}
}
