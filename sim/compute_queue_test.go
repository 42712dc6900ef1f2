package sim

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestComputeQueueFIFO: with one slot, prompts compute one at a time in the
// order they came; one whose client leaves while it waits leaves the queue
// (its tokens with it) and the next takes its place; the tokens left to
// compute follow each turn, corrected when the cache was looked up.
func TestComputeQueueFIFO(t *testing.T) {
	t.Parallel()
	q := &computeQueue{slots: 1}
	first, err := q.enter(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	type entered struct {
		name string
		t    *turn
		err  error
	}
	got := make(chan entered, 3)
	waitState := func(want queueState) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for q.state() != want { // the goroutines below enqueue on their own time
			select {
			case e := <-got:
				t.Fatalf("%s got its turn (%v) while the queue should be %+v", e.name, e.err, want)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the queue is %+v, want %+v", q.state(), want)
			}
			runtime.Gosched()
		}
	}
	enter := func(ctx context.Context, name string, n int) {
		go func() {
			tr, err := q.enter(ctx, n)
			got <- entered{name, tr, err}
		}()
	}
	enter(context.Background(), "second", 20)
	waitState(queueState{waiting: 1, tokens: 30})
	leaving, leave := context.WithCancel(context.Background())
	enter(leaving, "leaving", 40)
	waitState(queueState{waiting: 2, tokens: 70})
	enter(context.Background(), "third", 5)
	waitState(queueState{waiting: 3, tokens: 75})

	leave()
	if e := <-got; e.name != "leaving" || !errors.Is(e.err, context.Canceled) {
		t.Fatalf("a cancelled waiter: %s %v", e.name, e.err)
	}
	waitState(queueState{waiting: 2, tokens: 35})

	first.setUncached(4) // the cache held 6 of its tokens
	waitState(queueState{waiting: 2, tokens: 29})
	first.done()
	first.done() // twice changes nothing
	e := <-got
	if e.name != "second" || e.err != nil {
		t.Fatalf("after the first: %s %v, want second", e.name, e.err)
	}
	waitState(queueState{waiting: 1, tokens: 25})
	e.t.done()
	if e = <-got; e.name != "third" || e.err != nil {
		t.Fatalf("after the second: %s %v, want third", e.name, e.err)
	}
	e.t.done()
	if s := q.state(); s != (queueState{}) {
		t.Fatalf("an empty queue: %+v", s)
	}

	// No slots: no limit.
	free := &computeQueue{}
	for range 3 {
		if _, err := free.enter(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	if s := free.state(); s != (queueState{waiting: 0, tokens: 3}) {
		t.Fatalf("an unbounded queue: %+v", s)
	}
}
