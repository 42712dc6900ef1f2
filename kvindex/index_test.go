package kvindex

import (
	"slices"
	"strings"
	"testing"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, max := range []int{-1, maxMaxBlocks + 1} {
		if _, err := New(Config{MaxBlocks: max}); err == nil || !strings.Contains(err.Error(), "MaxBlocks") {
			t.Errorf("MaxBlocks %d: %v, want an error naming MaxBlocks", max, err)
		}
	}
	x, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if m := x.Add("p").max; m != DefaultMaxBlocks {
		t.Fatalf("an engine's cap is %d, want the default %d", m, DefaultMaxBlocks)
	}
}

// TestIndexEnginesAreIndependent: one peer's events never show in
// another's score, and a removed peer scores nothing.
func TestIndexEnginesAreIndependent(t *testing.T) {
	t.Parallel()
	x, err := New(Config{MaxBlocks: 100})
	if err != nil {
		t.Fatal(err)
	}
	f := setup(t, 0)
	a, b := x.Add("a"), x.Add("b")
	if x.Add("a") != a || x.Get("a") != a || x.Get("c") != nil {
		t.Fatal("Add or Get does not return the peer's engine")
	}
	if err := a.Apply(batch(stored("", f.prompt, h(1), h(2), h(3), h(4)))); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(batch(stored("", f.prompt[:bs], h(1)))); err != nil {
		t.Fatal(err)
	}
	peers := []string{"a", "b", "c"}
	if got := x.Score(nil, f.keys, peers); !slices.Equal(got, []int{4, 1, 0}) {
		t.Fatalf("Score = %v, want [4 1 0]", got)
	}
	b.Reset()
	if got := x.Score(nil, f.keys, peers); !slices.Equal(got, []int{4, 0, 0}) {
		t.Fatalf("Score after b's Reset = %v, want [4 0 0]", got)
	}
	x.Remove("a")
	x.Remove("a")
	if got := x.Score(nil, f.keys, peers); !slices.Equal(got, []int{0, 0, 0}) || x.Get("a") != nil {
		t.Fatalf("Score after a's removal = %v, want [0 0 0]", got)
	}
	if x.Add("a") == a || x.Add("a").Len() != 0 {
		t.Fatal("a peer added again got its old index")
	}
}

func TestScoreAllocatesNothing(t *testing.T) {
	x, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := setup(t, 0)
	if err := x.Add("a").Apply(batch(stored("", f.prompt, h(1), h(2), h(3), h(4)))); err != nil {
		t.Fatal(err)
	}
	peers := []string{"a", "b"}
	dst := make([]int, 0, 2)
	if n := testing.AllocsPerRun(100, func() { dst = x.Score(dst, f.keys, peers) }); n != 0 {
		t.Fatalf("Score allocated %v times with room in dst", n)
	}
}
