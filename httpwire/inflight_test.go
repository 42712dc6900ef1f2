package httpwire

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestInFlightWait: Wait returns at once with nothing in flight, waits
// while something is, returns when the count reaches zero, and gives up
// with its context; under concurrent counting no Wait is missed.
func TestInFlightWait(t *testing.T) {
	t.Parallel()
	var f InFlight
	if !f.Wait(context.Background()) {
		t.Fatal("Wait with nothing in flight")
	}
	f.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if f.Wait(ctx) {
		t.Fatal("Wait returned true with a request in flight")
	}
	done := make(chan bool)
	go func() { done <- f.Wait(context.Background()) }()
	select {
	case <-done:
		t.Fatal("Wait returned with a request in flight")
	case <-time.After(20 * time.Millisecond):
	}
	f.Add(-1)
	if !<-done {
		t.Fatal("Wait gave up")
	}
	if f.Count() != 0 || len(f.idle) != 0 {
		t.Fatalf("count %d, %d waits left registered", f.Count(), len(f.idle))
	}

	// Many requests and many waits at once: every wait ends once the
	// requests have.
	var wg sync.WaitGroup
	for range 50 {
		f.Add(1)
		wg.Add(2)
		go func() { defer wg.Done(); time.Sleep(time.Millisecond); f.Add(-1) }()
		go func() { defer wg.Done(); f.Wait(context.Background()) }()
	}
	wg.Wait()
	if f.Count() != 0 {
		t.Fatalf("count %d after every request ended", f.Count())
	}
}
