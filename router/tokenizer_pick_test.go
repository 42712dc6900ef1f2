package router

import (
	"testing"
	"time"
)

// TestTokenizerSkipsUnfitPrefills: the prompt is tokenized by the next
// prefill in turn whose breaker is closed and whose KV events subscription
// is live, so that no request waits on an engine its pick would avoid.
func TestTokenizerSkipsUnfitPrefills(t *testing.T) {
	t.Parallel()
	refs := make([]peerRef, 3)
	mv := &modelView{}
	for i := range refs {
		refs[i].state = &peerState{}
		s := &kvSub{}
		s.live.Store(true)
		refs[i].state.kv.Store(s)
		mv.tokenizers = append(mv.tokenizers, &refs[i])
	}
	refs[0].state.breaker.forceOpen(time.Now())
	refs[2].state.kv.Load().live.Store(false)
	for range 5 {
		if got := tokenizer(mv); got != &refs[1] {
			t.Fatalf("tokenizer picked ref %p, want the one fit prefill %p", got, &refs[1])
		}
	}
	refs[1].state.kv.Store(nil)
	if got := tokenizer(mv); got != nil {
		t.Fatalf("no prefill is fit, tokenizer picked %p", got)
	}
}
