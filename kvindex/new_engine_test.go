package kvindex

import (
	"strings"
	"testing"
)

func TestNewEngineValidates(t *testing.T) {
	t.Parallel()
	for _, max := range []int{-1, maxMaxBlocks + 1} {
		if _, err := NewEngine(Config{MaxBlocks: max}); err == nil || !strings.Contains(err.Error(), "MaxBlocks") {
			t.Errorf("MaxBlocks %d: %v, want an error naming MaxBlocks", max, err)
		}
	}
	e, err := NewEngine(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if e.max != DefaultMaxBlocks || e.BlockSize() != 0 {
		t.Fatalf("a new engine's cap is %d and block size %d, want the default %d and 0", e.max, e.BlockSize(), DefaultMaxBlocks)
	}
}

// TestEnginesAreIndependent: one engine's events never show in another's
// matches, and a reset engine matches nothing and forgets its block size.
func TestEnginesAreIndependent(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	a, _ := NewEngine(Config{MaxBlocks: 100})
	b, _ := NewEngine(Config{MaxBlocks: 100})
	if err := a.Apply(batch(stored("", f.prompt, h(1), h(2), h(3), h(4)))); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(batch(stored("", f.prompt[:bs], h(1)))); err != nil {
		t.Fatal(err)
	}
	if ma, mb := a.Match(f.keys), b.Match(f.keys); ma != 4 || mb != 1 || a.BlockSize() != bs {
		t.Fatalf("matches %d and %d, block size %d; want 4, 1 and %d", ma, mb, a.BlockSize(), bs)
	}
	b.Reset()
	if ma, mb := a.Match(f.keys), b.Match(f.keys); ma != 4 || mb != 0 || b.BlockSize() != 0 {
		t.Fatalf("after b's reset: matches %d and %d, b's block size %d; want 4, 0 and 0", ma, mb, b.BlockSize())
	}
}
