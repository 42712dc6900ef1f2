package kvindex

import (
	"math/rand/v2"
	"testing"

	"github.com/pdplane/pdplane/kvevents"
)

// TestKeySetAgainstAMap adds and removes keys whose home slots crowd the
// end of a 16-slot table, so that probe runs wrap around and removals shift
// keys back across the wrap; after every step each key is found exactly
// when a map says it is held.
func TestKeySetAgainstAMap(t *testing.T) {
	t.Parallel()
	var universe []uint64
	for _, home := range []uint64{13, 14, 15, 0, 1} {
		for j := range uint64(4) {
			universe = append(universe, home+16*(j+1))
		}
	}
	s := newKeySet(12)
	if len(s.slots) != 16 {
		t.Fatalf("%d slots for 12 keys, want 16", len(s.slots))
	}
	model := map[uint64]int{}
	r := rand.New(rand.NewPCG(5, 6))
	for step := range 20000 {
		k := universe[r.IntN(len(universe))]
		if model[k] > 0 && (s.n == 12 || r.IntN(2) == 0) {
			s.remove(k)
			model[k]--
		} else if s.n < 12 {
			s.add(k)
			model[k]++
		}
		total := 0
		for _, u := range universe {
			if got, want := s.has(u), model[u] > 0; got != want {
				t.Fatalf("step %d: has(%d) = %v, want %v", step, u, got, want)
			}
			total += model[u]
		}
		if s.n != total {
			t.Fatalf("step %d: n = %d, want %d", step, s.n, total)
		}
	}
}

func TestKeySetGrowsAsACopy(t *testing.T) {
	t.Parallel()
	s := newKeySet(0)
	for k := range uint64(12) {
		s.add(k + 1)
	}
	if s.withRoom(0, 100) != s {
		t.Fatal("a set with room was copied")
	}
	g := s.withRoom(1, 100)
	if g == s || len(g.slots) <= len(s.slots) || g.n != 12 || g.prefix([]uint64{1, 2, 3, 12}) != 4 {
		t.Fatalf("grown: %d slots, %d keys", len(g.slots), g.n)
	}
	if c := s.withRoom(1000, 100); len(c.slots) > 3*100 {
		t.Fatalf("%d slots for a cap of 100 keys", len(c.slots))
	}
}

// TestMatchSeesStableBlocksThroughChurn: blocks that stay are found by
// every Match, while other blocks come and go beside them, shifting keys
// in the set and growing it.
func TestMatchSeesStableBlocksThroughChurn(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt, h(1), h(2), h(3), h(4)))
	done := make(chan struct{})
	errs := make(chan int, 2)
	for range 2 {
		go func() {
			for {
				select {
				case <-done:
					errs <- -1
					return
				default:
				}
				if n := f.e.Match(f.keys); n != 4 {
					errs <- n
					return
				}
			}
		}()
	}
	for round := range 200 {
		var hashes []kvevents.Hash
		for i := range 8 + round {
			hashes = append(hashes, kvevents.Hash(binaryName(1000*round+i)))
		}
		if err := f.e.Apply(batch(stored("", seq(100000+round*1000, len(hashes)*bs), hashes...))); err != nil {
			t.Fatal(err)
		}
		if err := f.e.Apply(batch(removed("GPU", hashes[:len(hashes)/2]...))); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	for range 2 {
		if n := <-errs; n != -1 {
			t.Fatalf("Match = %d while other blocks changed, want 4", n)
		}
	}
	checkInvariants(t, f.e)
}
