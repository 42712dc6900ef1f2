package sim

import (
	"slices"
	"testing"
)

// run returns the prompt from, from+1, ..., from+n-1.
func run(from, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = from + i
	}
	return p
}

// TestPrefixCacheHits: a prompt's hit is its leading cached blocks, short
// of the block holding its last token (which the engines compute whatever
// they hold), and never a block past one that is missing; a shared prefix
// hits across prompts, and lookups are counted in prompt tokens.
func TestPrefixCacheHits(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		cached  [][]int // prompts inserted first, in order
		prompt  []int
		wantHit int
	}{
		{"empty cache", nil, run(0, 13), 0},
		{"the same prompt", [][]int{run(0, 13)}, run(0, 13), 12},
		{"a prompt of whole blocks keeps its last block to compute", [][]int{run(0, 12)}, run(0, 12), 8},
		{"a longer prompt with the prefix", [][]int{run(0, 9)}, run(0, 20), 8},
		{"a different first token", [][]int{run(0, 13)}, append([]int{99}, run(1, 12)...), 0},
		{"a change in the second block", [][]int{run(0, 13)}, append(run(0, 5), run(50, 8)...), 4},
		{"shorter than a block", [][]int{run(0, 13)}, run(0, 3), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newPrefixCache(4, 64)
			for _, p := range tt.cached {
				c.insert(p)
			}
			if got := c.peek(tt.prompt); got != tt.wantHit {
				t.Errorf("peek: %d cached tokens, want %d", got, tt.wantHit)
			}
			if got := c.lookup(tt.prompt); got != tt.wantHit {
				t.Errorf("lookup: %d cached tokens, want %d", got, tt.wantHit)
			}
			st := c.stats()
			if st.queried != int64(len(tt.prompt)) || st.hit != int64(tt.wantHit) || st.lastQueried != st.queried || st.lastHit != st.hit {
				t.Errorf("counters %+v after one lookup of %d tokens hitting %d", st, len(tt.prompt), tt.wantHit)
			}
		})
	}
}

// TestPrefixCacheEvictsLeastRecentlyUsed: beyond its capacity the cache
// drops the least recently used blocks; a lookup makes a prompt's blocks
// the most recent, and each change is told once, stored runs (with the
// parent before each run) then removed blocks.
func TestPrefixCacheEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	c := newPrefixCache(4, 4)
	var changes []cacheChange
	c.onChange = func(ch cacheChange) { changes = append(changes, ch) }
	a, b, d := run(0, 9), run(100, 9), run(200, 9) // two blocks each
	ha, hb := c.blockHashes(a), c.blockHashes(b)
	c.insert(a)
	c.insert(b)
	if len(changes) != 2 || len(changes[0].removed) != 0 || len(changes[0].stored) != 1 {
		t.Fatalf("changes after two prompts: %+v", changes)
	}
	first := changes[0].stored[0]
	if len(first) != 2 || first[0].hash != ha[0] || first[0].hasParent || !first[1].hasParent || first[1].parent != ha[0] ||
		!slices.Equal(first[1].tokens, a[4:8]) {
		t.Fatalf("a's stored run: %+v", first)
	}
	c.insert(a) // already held: no change, but a becomes the most recent
	if len(changes) != 2 {
		t.Fatalf("inserting a held prompt changed the cache: %+v", changes[2:])
	}
	c.insert(d) // evicts b's blocks, the least recently used
	last := changes[len(changes)-1]
	if !slices.Equal(last.removed, hb) || len(last.stored) != 1 || len(last.stored[0]) != 2 {
		t.Fatalf("inserting d: %+v, want b's blocks %v removed", last, hb)
	}
	if c.peek(a) != 8 || c.peek(b) != 0 {
		t.Fatalf("after d: a holds %d tokens, b %d; want 8 and 0", c.peek(a), c.peek(b))
	}
	// A hit in the middle of a prompt stores the runs around it, each
	// chained to the block before it.
	c2 := newPrefixCache(4, 64)
	var ch2 []cacheChange
	c2.onChange = func(ch cacheChange) { ch2 = append(ch2, ch) }
	p := run(0, 12)
	hp := c2.blockHashes(p)
	c2.insert(p)
	c2.lru.Remove(c2.blocks[hp[1]]) // as if evicted alone
	delete(c2.blocks, hp[1])
	c2.insert(p)
	got := ch2[len(ch2)-1].stored
	if len(got) != 1 || len(got[0]) != 1 || got[0][0].hash != hp[1] || got[0][0].parent != hp[0] {
		t.Fatalf("re-storing the middle block: %+v", got)
	}
}
