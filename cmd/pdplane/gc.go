package main

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
// second, each cycle's fixed costs included. gcFloor lets the heap grow to
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
type gcFloor struct {
	minHeap uint64
	sample  []metrics.Sample

	mu      sync.Mutex // adjust against stop
	stopped bool
	prev    int // the percentage before the floor, restored by stop
}

// runtimeHeapMinimum is the runtime's minimum heap goal at GOGC=100.
const runtimeHeapMinimum = 4 << 20

// gcPercentFor is the GOGC whose heap goal is minHeap for a cycle that
// found live bytes of heap and scan bytes of stacks and globals, and 100
// when the default's goal reaches minHeap. It is at most the percentage
// whose own minimum heap is minHeap: the goal of a nearly empty heap.
func gcPercentFor(live, scan, minHeap uint64) int {
	const base = 100
	if live+(live+scan) >= minHeap {
		return base
	}
	limit := max(base, minHeap*100/runtimeHeapMinimum)
	p := (minHeap - live) * 100 / max(live+scan, 1)
	return int(max(base, min(p, limit)))
}

// startGCFloor starts the floor; minHeap 0, or GOGC in the environment,
// starts nothing. stop gives the collector its earlier percentage back.
func startGCFloor(minHeap uint64) (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set || minHeap == 0 {
		return func() {}
	}
	g := &gcFloor{minHeap: minHeap, sample: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	// Before the first cycle nothing is known: the goal of an empty heap.
	g.prev = debug.SetGCPercent(gcPercentFor(0, 0, minHeap))
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

// defaultGCMinHeapMiB is --gc-min-heap-mib's default.
const defaultGCMinHeapMiB = 64

// gcMinHeapFlag is --gc-min-heap-mib, for the commands that serve load
// alone in their process (serve, sim); start it with startGCFloorMiB after
// parsing.
func gcMinHeapFlag(fs *flagSet, mib *int) {
	fs.int(mib, "gc-min-heap-mib", defaultGCMinHeapMiB, "MiB the heap may grow to between garbage collections however little of it is live "+
		"(fewer collections under load; above half of it live, collections are as at GOGC=100); 0, or GOGC set, leaves the Go defaults")
}

// startGCFloorMiB checks --gc-min-heap-mib's value and starts the floor.
func startGCFloorMiB(mib int) (stop func(), err error) {
	if mib < 0 || mib > 1<<20 {
		return nil, usageErrorf("invalid value %d for --gc-min-heap-mib: want 0 to 1048576 (1 TiB)", mib)
	}
	return startGCFloor(uint64(mib) << 20), nil
}

// gcSentinel is an object made unreachable on purpose: its finalizer runs
// once a collection has found it so, that is after every cycle.
type gcSentinel struct{ g *gcFloor }

func (g *gcFloor) arm() {
	runtime.SetFinalizer(&gcSentinel{g: g}, func(s *gcSentinel) {
		if s.g.adjust() {
			s.g.arm()
		}
	})
}

// adjust sets the percentage from what the last cycle found; false once
// the floor is stopped.
func (g *gcFloor) adjust() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	metrics.Read(g.sample) // all three exist since Go 1.21
	live, stacks, globals := g.sample[0].Value.Uint64(), g.sample[1].Value.Uint64(), g.sample[2].Value.Uint64()
	debug.SetGCPercent(gcPercentFor(live, stacks+globals, g.minHeap))
	return true
}
