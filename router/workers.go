package router

import "sync"

// A stream's dispatch runs on a goroutine beside net/http's (takeover.go).
// A goroutine started for it begins with a small stack, and by the time
// the answer's first bytes are relayed (run, attempt, runSGLang,
// deliverDecode, commit) it has grown that stack twice, copying the whole
// stack each time: 11 µs of a streamed request's ~300 µs, the largest
// single item in the router's own CPU (router/BENCHMARKS.md, "A goroutine
// kept between streams"). spareWorkers hands the dispatch instead to a
// goroutine kept from an earlier stream, whose stack has already grown.
var spareWorkers = workerPool{max: 256}

// workerPool runs functions on goroutines it keeps between calls. At
// most max wait idle; one more exits when its function returns. The
// latest to go idle is the first reused. Each collection halves the stack
// of a waiting worker that uses less than a quarter of it, so a stack
// stays grown between streams that come faster than collections (with
// serve's --gc-min-heap-mib, seconds apart under load) and shrinks back
// while the router is idle. The workers are never stopped: at most max
// goroutines and their shrunken stacks.
type workerPool struct {
	mu   sync.Mutex
	idle []chan func() // each waiting worker's inbox, latest last
	max  int
}

// run calls f on a goroutine of its own: an idle worker's, else a new one.
func (p *workerPool) run(f func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		inbox := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		inbox <- f // buffered: the worker is waiting or about to
		return
	}
	p.mu.Unlock()
	go p.work(f)
}

// work is a worker: it calls f, then waits for the next function unless
// max workers wait already. A panic in f ends the process, as it would
// on a goroutine started for f alone; callers recover their own.
func (p *workerPool) work(f func()) {
	var inbox chan func()
	for {
		f()
		f = nil // not kept alive while idle
		if inbox == nil {
			inbox = make(chan func(), 1)
		}
		p.mu.Lock()
		if len(p.idle) >= p.max {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, inbox)
		p.mu.Unlock()
		f = <-inbox
	}
}

// idleWorkers reports how many workers wait.
func (p *workerPool) idleWorkers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}
