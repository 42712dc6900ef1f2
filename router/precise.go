package router

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/pdplane/pdplane/kvindex"
)

// promptBlocks is one request's prompt as the precise policy matches it:
// its token IDs and their chained block keys, computed once per block
// size that a candidate's index uses (one, in a fleet of one model).
type promptBlocks struct {
	tokens []int32
	sizes  []int
	keys   [][]uint64
	// cached is the prompt tokens the last pick expects its prefill to
	// hold, for the route receipt and the predicted hit rate; scored says
	// the pick compared candidates by their blocks (it was not cache_aware).
	cached int
	scored bool
}

// keysFor returns the keys of the prompt's blocks of size bs that an
// engine may find cached: every full block but one holding the prompt's
// last token, which engines compute whatever they hold (vLLM's
// get_computed_blocks matches num_tokens-1 tokens, SGLang's
// _compute_max_prefix_len input_len-1).
func (q *promptBlocks) keysFor(bs int) []uint64 {
	for i, s := range q.sizes {
		if s == bs {
			return q.keys[i]
		}
	}
	k := kvindex.Keys(nil, q.tokens[:max(len(q.tokens)-1, 0)], bs)
	q.sizes = append(q.sizes, bs)
	q.keys = append(q.keys, k)
	return k
}

// promptBlocks asks one of the model's prefills that publish KV events, in
// turn, for q's tokens; nil when it could not (the request is then routed
// as cache_aware routes it). A prefill whose breaker is not closed, or whose
// events subscription is down, is passed over: a request must not wait out
// a failing engine's tokenize timeout when its pick would avoid that engine.
func (rt *Router) promptBlocks(ctx context.Context, q *request, mv *modelView) *promptBlocks {
	ref := tokenizer(mv)
	if ref == nil {
		rt.m.tokenize.failed.Inc()
		return nil
	}
	tokens, err := rt.promptTokens(ctx, q, ref.ep.url, ref.ep.protocol)
	switch {
	case errors.Is(err, errNoTokenizer):
		rt.m.tokenize.unsupported.Inc()
		return nil
	case err != nil:
		rt.m.tokenize.failed.Inc()
		rt.log.Debug().Err(err).Str("peer", ref.peer.Name).Msg("tokenize the prompt for the precise policy")
		return nil
	}
	rt.m.tokenize.ok.Inc()
	return &promptBlocks{tokens: tokens}
}

// tokenizer picks the next of the model's tokenizers, in turn, that is fit
// to answer: its breaker closed and its KV events subscription live; nil
// when none is.
func tokenizer(mv *modelView) *peerRef {
	n := uint64(len(mv.tokenizers))
	start := mv.tokenizeRR.Add(1)
	for k := range n {
		ref := mv.tokenizers[(start+k)%n]
		if s := ref.state.kv.Load(); s != nil && s.live.Load() && ref.state.breaker.current() == breakerClosed {
			return ref
		}
	}
	return nil
}

// queuedWork is the router's running estimate of the tokens a prefill
// computes per request: what one request queued ahead of another costs it.
// Each precise pick moves it a sixteenth of the way toward the tokens its
// prefill was expected to compute.
type queuedWork struct{ bits atomic.Uint64 }

func (w *queuedWork) get() float64 { return math.Float64frombits(w.bits.Load()) }

func (w *queuedWork) add(tokens float64) {
	old := w.get()
	if old == 0 {
		w.bits.Store(math.Float64bits(tokens))
		return
	}
	w.bits.Store(math.Float64bits(old + (tokens-old)/16))
}

// held is how many of keys, a prompt's blocks from the first, the engine
// is expected to hold when the prompt computes, behind queued blocks'
// worth of prompts this router sent it before.
//
// The index says what the engine holds now, but the prompts queued ahead
// compute first, and a full cache makes room for them by evicting its
// least recently used blocks. The router does not know how recently each
// block was used, so it takes a held prefix to survive in the proportion of
// the cache the queue ahead leaves: held × (1 − queued / capacity), while
// the engine is full (kvSub.capacity); an engine that has evicted nothing
// keeps it all. Blocks of the prompts sent ahead (sent) are held whatever
// the cache: they are computed, or used, just before.
func (s *kvSub) held(keys []uint64, queued float64) float64 {
	n := float64(s.index.Match(keys))
	if c := s.capacity.Load(); c > 0 && n > 0 {
		n *= max(0, 1-queued/float64(c))
	}
	return max(n, float64(s.sentMatch(keys)))
}

// queuedPrompt is a prompt the precise policy sent a prefill, as the
// prefill's queue counts it until the prompt's prefill leg ends: its
// uncached tokens, and its blocks among those sent the engine.
type queuedPrompt struct {
	st     *peerState
	tokens int64
	sub    *kvSub // nil when the engine's block size is not known yet
	keys   []uint64
}

// enqueue counts q at prefill st: its uncached tokens in st's queue, its
// blocks among those sent st's engine.
func (q *promptBlocks) enqueue(st *peerState) *queuedPrompt {
	qp := &queuedPrompt{st: st, tokens: int64(len(q.tokens) - q.cached)}
	st.queued.Add(qp.tokens)
	if s := st.kv.Load(); s != nil {
		if bs := s.index.BlockSize(); bs > 0 {
			qp.sub, qp.keys = s, q.keysFor(bs)
			s.send(qp.keys)
		}
	}
	return qp
}

// dequeue undoes enqueue.
func (qp *queuedPrompt) dequeue() {
	qp.st.queued.Add(-qp.tokens)
	if qp.sub != nil {
		qp.sub.unsend(qp.keys)
	}
}

// send counts keys, the blocks of a prompt sent to the engine, until unsend.
func (s *kvSub) send(keys []uint64) {
	s.sentMu.Lock()
	defer s.sentMu.Unlock()
	if s.sent == nil {
		s.sent = make(map[uint64]int32)
	}
	for _, k := range keys {
		s.sent[k]++
	}
}

// unsend stops counting keys, once its prompt's prefill leg ended: the
// engine's KV events tell what it holds from then on.
func (s *kvSub) unsend(keys []uint64) {
	s.sentMu.Lock()
	defer s.sentMu.Unlock()
	for _, k := range keys {
		if s.sent[k]--; s.sent[k] <= 0 {
			delete(s.sent, k)
		}
	}
}

// sentMatch returns how many of keys, from the first, are blocks of
// prompts sent and not yet computed.
func (s *kvSub) sentMatch(keys []uint64) int {
	s.sentMu.Lock()
	defer s.sentMu.Unlock()
	for i, k := range keys {
		if s.sent[k] == 0 {
			return i
		}
	}
	return len(keys)
}

// precise picks the eligible prefill where the prompt would be computed
// soonest: the fewest prompt tokens it will not hold (held) plus the work
// queued ahead of it (the uncached tokens of this router's prefills in flight
// there, and the other requests its load reports, at the tokens a request
// costs on average). Ties go to the first from a random start. It looks at every
// candidate: O(candidates + blocks matched), no I/O. With no prompt, or no
// candidate whose index is live, it is cache_aware.
func (rt *Router) precise(cs candidates, ring *hashRing, key uint64, pc *pickCtx) int {
	q := pc.prompt
	if q == nil || len(q.tokens) == 0 {
		return rt.cacheAware(cs, ring, key, pc)
	}
	n := len(cs.c)
	work := rt.work.get()
	if work == 0 {
		work = float64(len(q.tokens))
	}
	best, bestCached, live := -1, 0, false
	var bestCost float64
	for k, i := 0, rand.IntN(n); k < n; k, i = k+1, next(i, n) {
		c := cs.c[i]
		if !rt.eligible(pc, c) {
			continue
		}
		queued := float64(c.state.queued.Load())
		cached := 0
		if s := c.state.kv.Load(); s != nil && s.live.Load() {
			live = true
			if bs := s.index.BlockSize(); bs > 0 {
				cached = int(s.held(q.keysFor(bs), queued/float64(bs))) * bs
			}
		}
		// The work ahead of the prompt: the tokens of this router's own
		// prefills there, and the requests others sent as the engine
		// reported them, at the tokens a request costs on average.
		reqs, _ := pc.load(cs, i)
		others := max(reqs-c.state.inflight.Load(), 0)
		cost := float64(len(q.tokens)-cached) + queued + float64(others)*work
		if best < 0 || cost < bestCost {
			best, bestCost, bestCached = i, cost, cached
		}
	}
	if !live {
		return rt.cacheAware(cs, ring, key, pc)
	}
	if best >= 0 {
		q.cached, q.scored = bestCached, true
		rt.work.add(float64(len(q.tokens) - bestCached))
	}
	return best
}
