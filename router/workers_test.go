package router

import (
	"sync"
	"testing"
	"testing/synctest"
)

// TestWorkerPoolReusesIdleWorkers checks that a function runs on a worker
// left idle by an earlier one (the idle count falls as it starts), and
// that no more than max wait idle. In a bubble, synctest.Wait returns once
// every worker is blocked: the idle count is then final, not a moment's.
func TestWorkerPoolReusesIdleWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &workerPool{max: 2}
		defer retireWorkers(p)
		release := make(chan struct{})
		var started sync.WaitGroup
		for range 3 {
			started.Add(1)
			p.run(func() { started.Done(); <-release })
		}
		started.Wait()
		if n := p.idleWorkers(); n != 0 {
			t.Fatalf("%d idle while all three run, want 0", n)
		}
		close(release)
		wantIdle(t, p, 2) // the third exits: max is 2

		ran := make(chan struct{})
		hold := make(chan struct{})
		p.run(func() { close(ran); <-hold })
		<-ran
		if n := p.idleWorkers(); n != 1 {
			t.Fatalf("%d idle while one runs, want 1: the function did not run on an idle worker", n)
		}
		close(hold)
		wantIdle(t, p, 2)
	})
}

// wantIdle waits until every worker has run its function and either waits
// idle or has exited, then checks how many wait.
func wantIdle(t *testing.T, p *workerPool, want int) {
	t.Helper()
	synctest.Wait()
	if n := p.idleWorkers(); n != want {
		t.Fatalf("%d idle workers, want %d", n, want)
	}
}

// retireWorkers makes p's idle workers exit, as the bubble requires of its
// goroutines before the test ends (the pool's never do on their own).
func retireWorkers(p *workerPool) {
	p.mu.Lock()
	p.max = 0
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, inbox := range idle {
		inbox <- func() {}
	}
}
