// Package gcfloor keeps the Go collector from running several times a
// second in a process whose live heap is small but which allocates quickly:
// a router between requests. It is process-wide runtime tuning, started once
// by the commands that serve load alone in their process (serve, sim).
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// A router's live heap is small (a few MiB between requests) while it
// allocates quickly (~12 KiB a request), so at the collector's default
// (GOGC=100: collect once the heap has doubled) it collects several times a
// second, each cycle's fixed costs included. floor lets the heap grow to
// minHeap between collections; once the default would let it grow that far
// (about half of minHeap live), collections are as at GOGC=100, so what a
// process holds at scale (held streams, a large fleet's snapshot) is as
// before.
//
// It sets the collector's percentage (GOGC, debug.SetGCPercent) after every
// cycle from what that cycle found (runtime/metrics: the live heap, and the
// stacks and globals it scanned). The runtime's heap goal at percentage p is
// live + (live + stacks + globals) × p/100, and never below a minimum of
// 4 MiB × p/100 (runtime/mgcpacer.go, heapGoal and setGCPercent). It
// leaves the collector alone when the operator set GOGC; GOMEMLIMIT still
// bounds the heap as usual.
type floor struct {
	minHeap uint64
	sample  []metrics.Sample

	mu      sync.Mutex // adjust against stop
	stopped bool
	prev    int // the percentage before the floor, restored by stop
}

// runtimeHeapMinimum is the runtime's minimum heap goal at GOGC=100.
const runtimeHeapMinimum = 4 << 20

// percentFor is the GOGC whose heap goal is minHeap for a cycle that
// found live bytes of heap and scan bytes of stacks and globals, and 100
// when the default's goal reaches minHeap. It is at most the percentage
// whose own minimum heap is minHeap: the goal of a nearly empty heap.
func percentFor(live, scan, minHeap uint64) int {
	const base = 100
	if live+(live+scan) >= minHeap {
		return base
	}
	limit := max(base, minHeap*100/runtimeHeapMinimum)
	p := (minHeap - live) * 100 / max(live+scan, 1)
	return int(max(base, min(p, limit)))
}

// Start starts the floor; minHeap 0, or GOGC in the environment,
// starts nothing. stop gives the collector its earlier percentage back.
func Start(minHeap uint64) (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set || minHeap == 0 {
		return func() {}
	}
	g := &floor{minHeap: minHeap, sample: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	// Before the first cycle nothing is known: the goal of an empty heap.
	g.prev = debug.SetGCPercent(percentFor(0, 0, minHeap))
	g.arm()
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.stopped {
			g.stopped = true
			debug.SetGCPercent(g.prev)
		}
	}
}

// sentinel is an object made unreachable on purpose: its finalizer runs
// once a collection has found it so, that is after every cycle.
type sentinel struct{ g *floor }

func (g *floor) arm() {
	runtime.SetFinalizer(&sentinel{g: g}, func(s *sentinel) {
		if s.g.adjust() {
			s.g.arm()
		}
	})
}

// adjust sets the percentage from what the last cycle found; false once
// the floor is stopped.
func (g *floor) adjust() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	metrics.Read(g.sample) // all three exist since Go 1.21
	live, stacks, globals := g.sample[0].Value.Uint64(), g.sample[1].Value.Uint64(), g.sample[2].Value.Uint64()
	debug.SetGCPercent(percentFor(live, stacks+globals, g.minHeap))
	return true
}
