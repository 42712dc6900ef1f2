package router

import (
	"sync"
	"testing"
	"time"
)

// TestWorkerPoolReusesIdleWorkers checks that a function runs on a worker
// left idle by an earlier one (the idle count falls as it starts), and
// that no more than max wait idle.
func TestWorkerPoolReusesIdleWorkers(t *testing.T) {
	p := &workerPool{max: 2}
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
	waitIdle(t, p, 2) // the third exits: max is 2

	ran := make(chan struct{})
	hold := make(chan struct{})
	p.run(func() { close(ran); <-hold })
	<-ran
	if n := p.idleWorkers(); n != 1 {
		t.Fatalf("%d idle while one runs, want 1: the function did not run on an idle worker", n)
	}
	close(hold)
	waitIdle(t, p, 2)
}

func waitIdle(t *testing.T, p *workerPool, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.idleWorkers() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers, want %d", p.idleWorkers(), want)
		}
		time.Sleep(time.Millisecond)
	}
	// No more go idle later: the count stays.
	time.Sleep(20 * time.Millisecond)
	if n := p.idleWorkers(); n != want {
		t.Fatalf("%d idle workers after a moment, want %d", n, want)
	}
}
