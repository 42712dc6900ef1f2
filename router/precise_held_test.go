package router

import (
	"testing"

	"github.com/pdplane/pdplane/kvevents"
	"github.com/pdplane/pdplane/kvindex"
)

// TestHeldCountsWhatSurvivesTheQueue pins the precise policy's expectation
// of the blocks a prefill holds when a prompt computes (kvSub.held): all
// that its index holds while the engine has evicted nothing; once it has,
// the share the queue ahead leaves of its cache (capacity: the most blocks
// the index held); and the blocks of prompts sent ahead, whatever the
// queue, until their prefill legs end.
func TestHeldCountsWhatSurvivesTheQueue(t *testing.T) {
	const bs = 16
	index, err := kvindex.NewEngine(kvindex.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := &kvSub{index: index}
	next := 0
	// prompt returns the tokens of a prompt of n blocks, each token new.
	prompt := func(n int) []int32 {
		out := make([]int32, n*bs)
		for i := range out {
			next++
			out[i] = int32(next)
		}
		return out
	}
	hashes := func(from, n int) []kvevents.Hash {
		out := make([]kvevents.Hash, n)
		for i := range out {
			out[i] = kvevents.Hash([]byte{0, byte(from + i)})
		}
		return out
	}
	apply := func(evs ...kvevents.Event) {
		t.Helper()
		b := kvevents.Batch{Events: evs}
		if err := s.index.Apply(b); err != nil {
			t.Fatal(err)
		}
		s.learnCapacity(b)
	}
	store := func(tokens []int32, hs []kvevents.Hash) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hs, TokenIDs: tokens, BlockSize: bs, Medium: "GPU"}
	}
	var keys []uint64 // our prompt's
	check := func(what string, queued, want float64) {
		t.Helper()
		if got := s.held(keys, queued); got != want {
			t.Errorf("%s: held with %v blocks queued ahead = %v, want %v", what, queued, got, want)
		}
	}

	ours := prompt(8)
	keys = kvindex.Keys(nil, ours, bs)
	apply(store(ours, hashes(0, 8)), store(prompt(8), hashes(8, 8)))
	check("nothing evicted yet", 1000, 8)
	// An offload tier's removal says nothing of the GPU's room.
	apply(kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes(100, 1), Medium: "CPU"})
	check("a CPU removal", 1000, 8)
	if c := s.capacity.Load(); c != 0 {
		t.Fatalf("capacity %d after a CPU removal, want 0 (unknown)", c)
	}

	// The engine makes room for 4 blocks by evicting 4 of the other
	// prompt's: it is full at 16 blocks.
	apply(store(prompt(4), hashes(16, 4)), kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes(12, 4), Medium: "GPU"})
	if c := s.capacity.Load(); c != 16 {
		t.Fatalf("capacity %d, want the 16 blocks the index held at most", c)
	}
	check("an empty queue", 0, 8)
	check("half the cache queued ahead", 8, 4)
	check("the whole cache queued ahead", 16, 0)
	check("more than the cache queued ahead", 40, 0)

	// A prompt sent ahead with the same first 5 blocks holds those
	// whatever the queue, until its prefill leg ends.
	sent := keys[:5]
	s.send(sent)
	s.send(sent)
	check("5 blocks sent ahead, twice", 40, 5)
	s.unsend(sent)
	check("5 blocks sent ahead, once", 40, 5)
	s.unsend(sent)
	check("the sent prompts' legs ended", 40, 0)
	if len(s.sent) != 0 {
		t.Errorf("%d keys still counted as sent", len(s.sent))
	}
}
