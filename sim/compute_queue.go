package sim

import (
	"container/list"
	"context"
	"sync"
)

// computeQueue is the engine's compute. A real engine runs its prefills a
// batch at a time, so that under load prompts wait for their turn (vLLM's
// and SGLang's waiting queues); with slots > 0 at most slots prompts compute
// at once and the others wait, first come first served. slots == 0 lets
// every prompt compute as soon as it comes, each on its own.
//
// The queue also keeps the figures a router's oracle reads
// (/_sim/cache_probe): how many prompts wait, and how many tokens the
// prompts waiting or computing have left to compute.
type computeQueue struct {
	slots int

	mu      sync.Mutex
	busy    int       // turns computing
	waiting list.List // of *turn, in arrival order
	tokens  int64     // uncached tokens of every turn waiting or computing
}

// turn is one prompt's place at the compute, from the time it waits to the
// time its compute ends (done).
type turn struct {
	q     *computeQueue
	elem  *list.Element // in q.waiting while it waits
	ready chan struct{} // closed when a waiting turn may compute
	// uncached is the prompt's tokens to compute: what the prefix cache
	// did not hold when it came, then when it started.
	uncached int
	granted  bool // it computes (or may)
	released bool // done, or it left the queue
}

// enter waits for a turn to compute a prompt of uncached tokens to compute,
// until ctx ends; a request whose client went away leaves the queue.
func (q *computeQueue) enter(ctx context.Context, uncached int) (*turn, error) {
	t := &turn{q: q, uncached: uncached}
	q.mu.Lock()
	q.tokens += int64(uncached)
	if q.slots == 0 || q.busy < q.slots && q.waiting.Len() == 0 {
		q.busy++
		t.granted = true
		q.mu.Unlock()
		return t, nil
	}
	t.ready = make(chan struct{})
	t.elem = q.waiting.PushBack(t)
	q.mu.Unlock()
	select {
	case <-t.ready:
		return t, nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	if t.granted { // its turn came as its client left: pass it on
		q.mu.Unlock()
		t.done()
		return nil, ctx.Err()
	}
	q.waiting.Remove(t.elem)
	q.tokens -= int64(t.uncached)
	t.released = true
	q.mu.Unlock()
	return nil, ctx.Err()
}

// setUncached corrects the tokens the turn has to compute, once the prefix
// cache was looked up as it started.
func (t *turn) setUncached(n int) {
	t.q.mu.Lock()
	defer t.q.mu.Unlock()
	if !t.released {
		t.q.tokens += int64(n - t.uncached)
	}
	t.uncached = n
}

// done ends the turn's compute and lets the next waiting turn compute. It
// may be called more than once.
func (t *turn) done() {
	q := t.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.released {
		return
	}
	t.released = true
	q.tokens -= int64(t.uncached)
	q.busy--
	if e := q.waiting.Front(); e != nil && (q.slots == 0 || q.busy < q.slots) {
		next := q.waiting.Remove(e).(*turn)
		next.granted = true
		q.busy++
		close(next.ready)
	}
}

// queueState is what the queue holds now.
type queueState struct {
	waiting int   // prompts waiting for their turn
	tokens  int64 // tokens the prompts waiting or computing have to compute
}

func (q *computeQueue) state() queueState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueState{waiting: q.waiting.Len(), tokens: q.tokens}
}
