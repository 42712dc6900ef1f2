package kvindex

import (
	"errors"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/pdplane/pdplane/kvevents"
)

const bs = 16

// h names an engine block hash, as vLLM's integer hashes are published.
func h(i int) kvevents.Hash {
	return kvevents.Hash([]byte{0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)})
}

func stored(parent kvevents.Hash, tokens []int32, hashes ...kvevents.Hash) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, ParentHash: parent,
		TokenIDs: tokens, BlockSize: bs, Medium: "GPU"}
}

func removed(medium string, hashes ...kvevents.Hash) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes, Medium: medium}
}

func batch(events ...kvevents.Event) kvevents.Batch { return kvevents.Batch{Events: events} }

type fixture struct {
	e      *Engine
	prompt []int32  // 4 blocks of bs tokens
	keys   []uint64 // Keys(prompt)
}

func setup(t *testing.T, max int) fixture {
	t.Helper()
	prompt := seq(500, 4*bs)
	return fixture{e: newEngine(Config{MaxBlocks: max}.WithDefaults()), prompt: prompt, keys: Keys(nil, prompt, bs)}
}

func (f fixture) apply(t *testing.T, events ...kvevents.Event) {
	t.Helper()
	if err := f.e.Apply(batch(events...)); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, f.e)
}

// checkInvariants holds the engine's blocks to its key set: every block's
// key is in the set once for each block with it, and nothing else is.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	counts := map[uint64]int{}
	for _, b := range e.blocks {
		counts[b.key]++
		if b.media == 0 {
			t.Fatalf("a block held on no medium")
		}
	}
	held := heldKeys(e)
	if len(counts) != len(held) {
		t.Fatalf("%d keys held, %d among the blocks", len(held), len(counts))
	}
	for k, c := range counts {
		if held[k] != c {
			t.Fatalf("key %x held %d times, %d blocks have it", k, held[k], c)
		}
		if e.held.Load().prefix([]uint64{k}) != 1 {
			t.Fatalf("key %x is in the set where a probe does not find it", k)
		}
	}
	if e.Len() != len(e.blocks) || e.held.Load().n != len(e.blocks) {
		t.Fatalf("Len %d, set count %d, %d blocks", e.Len(), e.held.Load().n, len(e.blocks))
	}
}

// heldKeys counts the keys in the engine's set.
func heldKeys(e *Engine) map[uint64]int {
	held := map[uint64]int{}
	s := e.held.Load()
	for i := range s.slots {
		if k := s.slots[i].Load(); k != 0 {
			held[k]++
		}
	}
	return held
}

func TestStoredChainMatches(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt[:3*bs], h(1), h(2), h(3)))
	if n := f.e.Match(f.keys); n != 3 {
		t.Fatalf("Match = %d, want the 3 blocks stored", n)
	}
	if n := f.e.Match(f.keys[:2]); n != 2 {
		t.Fatalf("Match of a 2-block prompt = %d, want 2", n)
	}
	other := Keys(nil, seq(9000, 4*bs), bs)
	if n := f.e.Match(other); n != 0 {
		t.Fatalf("Match of another prompt = %d, want 0", n)
	}
	if n := f.e.Match(append([]uint64{other[0]}, f.keys...)); n != 0 {
		t.Fatalf("Match counts keys after a miss: %d", n)
	}
	if f.e.Len() != 3 {
		t.Fatalf("Len = %d, want 3", f.e.Len())
	}
}

// TestChainStoredInTwoEvents: the second event's first block is keyed from
// its parent's key, found by the parent's engine hash.
func TestChainStoredInTwoEvents(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt[:2*bs], h(1), h(2)))
	f.apply(t, stored(h(2), f.prompt[2*bs:4*bs], h(3), h(4)))
	if n := f.e.Match(f.keys); n != 4 {
		t.Fatalf("Match = %d, want 4", n)
	}
	// The same tokens after another parent are another prefix.
	g := setup(t, 0)
	g.apply(t, stored("", f.prompt[:bs], h(1)), stored("", seq(7000, bs), h(9)))
	g.apply(t, stored(h(9), f.prompt[bs:2*bs], h(2)))
	if n := g.e.Match(f.keys); n != 1 {
		t.Fatalf("Match = %d, want 1: block 1 was stored after another block 0", n)
	}
}

func TestUnknownParentIsNotKeyed(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored(h(2), f.prompt[2*bs:4*bs], h(3), h(4)))
	if f.e.Len() != 0 {
		t.Fatalf("Len = %d: blocks with an unknown parent were indexed", f.e.Len())
	}
	if s := f.e.Stats(); s.Unkeyed != 2 {
		t.Fatalf("Unkeyed = %d, want 2", s.Unkeyed)
	}
	// Once the chain is stored from its start, its children are keyed.
	f.apply(t, stored("", f.prompt[:2*bs], h(1), h(2)), stored(h(2), f.prompt[2*bs:4*bs], h(3), h(4)))
	if n := f.e.Match(f.keys); n != 4 {
		t.Fatalf("Match = %d, want 4", n)
	}
}

// TestBlocksKeyedByMoreAreNotIndexed: a LoRA's blocks (or blocks with
// extra keys) share their tokens with the base model's, but not their
// cache: they, and the blocks chained from them, match no request.
func TestBlocksKeyedByMoreAreNotIndexed(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	lora := stored("", f.prompt[:2*bs], h(1), h(2))
	lora.Extra = true
	f.apply(t, lora, stored(h(2), f.prompt[2*bs:4*bs], h(3), h(4)))
	if n := f.e.Match(f.keys); n != 0 || f.e.Len() != 0 || f.e.Stats().Unkeyed != 4 {
		t.Fatalf("Match = %d, Len = %d, Unkeyed = %d; want 0, 0, 4", n, f.e.Len(), f.e.Stats().Unkeyed)
	}
}

func TestRemovedAndCleared(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt, h(1), h(2), h(3), h(4)))
	f.apply(t, removed("GPU", h(3), h(99)))
	if n := f.e.Match(f.keys); n != 2 {
		t.Fatalf("Match = %d after block 2 was removed, want 2", n)
	}
	if f.e.Len() != 3 {
		t.Fatalf("Len = %d, want 3", f.e.Len())
	}
	f.apply(t, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	if n, l := f.e.Match(f.keys), f.e.Len(); n != 0 || l != 0 {
		t.Fatalf("after AllBlocksCleared: Match %d, Len %d", n, l)
	}
	// The engine's block size outlives its cache.
	ev := stored("", seq(0, 32), h(1))
	ev.BlockSize = 32
	var bse *BlockSizeError
	if err := f.e.Apply(batch(ev)); !errors.As(err, &bse) || bse.Have != bs || bse.Got != 32 {
		t.Fatalf("blocks of 32 after AllBlocksCleared: %v, want a BlockSizeError", err)
	}
}

// TestSameTokensTwoHashes: the engine hashes what the router cannot see
// (a LoRA, a cache salt): two of its blocks may have one router key, held
// while either is.
func TestSameTokensTwoHashes(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt[:bs], h(1)), stored("", f.prompt[:bs], h(2)))
	f.apply(t, removed("GPU", h(1)))
	if n := f.e.Match(f.keys); n != 1 {
		t.Fatalf("Match = %d, want 1: block h(2) holds the same tokens", n)
	}
	f.apply(t, removed("GPU", h(2)))
	if n := f.e.Match(f.keys); n != 0 {
		t.Fatalf("Match = %d, want 0", n)
	}
}

// TestMedia: a block offloaded to CPU still counts once the GPU dropped it,
// as vLLM's offloading connector tells it (a BlockStored without tokens).
func TestMedia(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt[:2*bs], h(1), h(2)))
	f.apply(t, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []kvevents.Hash{h(1), h(2), h(77)}, BlockSize: bs, Medium: "CPU"})
	if s := f.e.Stats(); s.Unkeyed != 1 {
		t.Fatalf("Unkeyed = %d, want 1: a copy of a block the index never held", s.Unkeyed)
	}
	f.apply(t, removed("GPU", h(1), h(2)))
	if n := f.e.Match(f.keys); n != 2 {
		t.Fatalf("Match = %d, want 2: the CPU holds both blocks", n)
	}
	f.apply(t, removed("CPU", h(2)))
	if n := f.e.Match(f.keys); n != 1 {
		t.Fatalf("Match = %d, want 1", n)
	}
	// No medium is the GPU (vLLM before media were published).
	f.apply(t, stored("", f.prompt[:bs], h(1)))
	f.apply(t, removed("CPU", h(1)), removed("", h(1)))
	if f.e.Len() != 0 {
		t.Fatalf("Len = %d, want 0", f.e.Len())
	}
}

func TestOtherGroupsLeftOut(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	other := stored("", seq(0, 2*bs), h(5), h(6))
	other.GroupIdx, other.BlockSize = 1, 2*bs
	other.TokenIDs = seq(0, 4*bs)
	f.apply(t, stored("", f.prompt[:bs], h(1)), other)
	gone := removed("GPU", h(1))
	gone.GroupIdx = 1
	f.apply(t, gone)
	if n, l := f.e.Match(f.keys), f.e.Len(); n != 1 || l != 1 {
		t.Fatalf("Match %d, Len %d: want group 0's block only, kept", n, l)
	}
}

// TestRefusedBatchChangesNothing: a batch with a block size other than the
// engine's, or malformed, is refused whole.
func TestRefusedBatchChangesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	f.apply(t, stored("", f.prompt[:bs], h(1)))
	big := stored(h(1), seq(0, 32), h(2))
	big.BlockSize = 32
	var bse *BlockSizeError
	err := f.e.Apply(batch(removed("GPU", h(1)), stored(h(1), f.prompt[bs:2*bs], h(2)), big))
	if !errors.As(err, &bse) || bse.Have != bs || bse.Got != 32 {
		t.Fatalf("Apply = %v, want a BlockSizeError (have %d, got 32)", err, bs)
	}
	short := stored(h(1), f.prompt[bs:2*bs-1], h(2))
	if err := f.e.Apply(batch(removed("GPU", h(1)), short)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Apply of %d tokens for a block of %d = %v, want ErrMalformed", len(short.TokenIDs), bs, err)
	}
	checkInvariants(t, f.e)
	if n, l := f.e.Match(f.keys), f.e.Len(); n != 1 || l != 1 {
		t.Fatalf("after refused batches: Match %d, Len %d, want 1 and 1", n, l)
	}
	// A first batch with two sizes is refused too, and the reset index
	// takes a new size.
	g := setup(t, 0)
	if err := g.e.Apply(batch(stored("", f.prompt[:bs], h(1)), big)); !errors.As(err, &bse) {
		t.Fatalf("a first batch with two block sizes: %v", err)
	}
	f.e.Reset()
	if f.e.Len() != 0 || f.e.Match(f.keys) != 0 {
		t.Fatal("Reset left blocks")
	}
	big.ParentHash = ""
	f.apply(t, big)
	if n := f.e.Match(Keys(nil, big.TokenIDs, 32)); n != 1 {
		t.Fatalf("blocks of 32 after Reset: Match %d, want 1", n)
	}
}

func TestCapDropsOldestFirst(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	prompts := make([][]int32, 6)
	for i := range prompts {
		prompts[i] = seq(1000*i, bs)
		f.apply(t, stored("", prompts[i], h(i)))
	}
	for i, p := range prompts {
		want := 0
		if i >= 2 {
			want = 1
		}
		if n := f.e.Match(Keys(nil, p, bs)); n != want {
			t.Fatalf("prompt %d: Match %d, want %d", i, n, want)
		}
	}
	if s := f.e.Stats(); s.Blocks != 4 || s.Evicted != 2 {
		t.Fatalf("Stats %+v, want 4 blocks, 2 evicted", s)
	}
	// A block stored again counts from its latest store.
	f.apply(t, removed("GPU", h(2)), stored("", prompts[2], h(2)))
	f.apply(t, stored("", seq(99000, bs), h(50)))
	if n := f.e.Match(Keys(nil, prompts[3], bs)); n != 0 {
		t.Fatalf("prompt 3 kept: the block stored again was dropped in its place")
	}
	if n := f.e.Match(Keys(nil, prompts[2], bs)); n != 1 {
		t.Fatalf("prompt 2, stored again, was dropped as if stored first")
	}
}

// TestVLLMFixture applies the batch vLLM's own encoder wrote
// (kvevents/testdata): the keys the index learns are those Keys gives the
// fixture's tokens.
func TestVLLMFixture(t *testing.T) {
	t.Parallel()
	payload, err := os.ReadFile("../kvevents/testdata/vllm-batch.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvevents.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(Config{}.WithDefaults())
	// Its two BlockStored events: blocks 0 and 1, then block 2 chained
	// from block 1.
	if err := e.Apply(kvevents.Batch{Events: b.Events[:2]}); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, e)
	want := Keys(nil, seq(0, 3*128), 128)
	if n := e.Match(want); n != 3 {
		t.Fatalf("Match = %d, want 3", n)
	}
	got := slices.Sorted(maps.Keys(heldKeys(e)))
	if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("held keys %x, want Keys() of the fixture's tokens %x", got, want)
	}
	// Then block 0 removed, and all cleared.
	if err := e.Apply(kvevents.Batch{Events: b.Events[2:3]}); err != nil {
		t.Fatal(err)
	}
	if n, m := e.Match(want), e.Match(want[1:]); n != 0 || m != 2 {
		t.Fatalf("after block 0's removal: Match %d and %d from block 1, want 0 and 2", n, m)
	}
	if err := e.Apply(kvevents.Batch{Events: b.Events[3:]}); err != nil {
		t.Fatal(err)
	}
	if e.Len() != 0 {
		t.Fatalf("Len = %d after AllBlocksCleared", e.Len())
	}
}

// TestConcurrentApplyAndMatch: an event is applied whole, so a reader sees
// a chain stored (or removed) in one event entirely or not at all.
func TestConcurrentApplyAndMatch(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	store := batch(stored("", f.prompt, h(1), h(2), h(3), h(4)))
	remove := batch(removed("GPU", h(1), h(2), h(3), h(4)))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if n := f.e.Match(f.keys); n != 0 && n != 4 {
					t.Errorf("Match = %d, want 0 or 4", n)
					return
				}
			}
		})
	}
	for range 2000 {
		if err := f.e.Apply(store); err != nil {
			t.Fatal(err)
		}
		if err := f.e.Apply(remove); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	checkInvariants(t, f.e)
}

// TestOrderShrinksAfterRemovals: the entries of removed blocks go, and
// their memory with them, once they outnumber the blocks held.
func TestOrderShrinksAfterRemovals(t *testing.T) {
	t.Parallel()
	f := setup(t, 0)
	const n = 20000
	hashes := make([]kvevents.Hash, n)
	for i := range hashes {
		hashes[i] = kvevents.Hash(binaryName(i))
	}
	f.apply(t, stored("", seq(0, n*bs), hashes...))
	f.apply(t, removed("GPU", hashes[1:]...))
	f.apply(t, stored(hashes[0], f.prompt[:bs], h(1)))
	if l, c := len(f.e.order.ids), cap(f.e.order.ids); l != 2 || c > 4*(2+minOrder) {
		t.Fatalf("the order holds %d entries in room for %d, want the 2 blocks left", l, c)
	}
	checkBounded(t, f.e)
}

func binaryName(i int) string { return string([]byte{'b', byte(i >> 16), byte(i >> 8), byte(i)}) }
