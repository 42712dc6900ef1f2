package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// A router's live heap is small (a few MiB between requests) while it
// allocates quickly (~12 KiB a request), so at the collector's default
// (GOGC=100: collect once the heap has doubled) it collects several times a
// second, each cycle's fixed costs included. gcFloor lets the heap grow to
// at least minHeap between collections; a heap whose live part is above
// half of minHeap is collected as at GOGC=100, so what a process holds at
// scale (held streams, a large fleet's snapshot) is as before.
//
// It sets the collector's percentage (GOGC, debug.SetGCPercent) after every
// cycle from the live heap that cycle found (runtime/metrics
// /gc/heap/live:bytes), so that the heap goal is max(minHeap, 2 × live).
// It leaves the collector alone when the operator set GOGC; GOMEMLIMIT
// still bounds the heap as usual.
type gcFloor struct {
	minHeap uint64
	stopped atomic.Bool
	sample  []metrics.Sample
}

// gcPercentFor is the GOGC that puts the heap goal, live × (1 + p/100), at
// minHeap when live is small (at most maxGCPercent), and at the default
// 2 × live otherwise.
func gcPercentFor(live, minHeap uint64) int {
	const base = 100
	if 2*live >= minHeap {
		return base
	}
	if live == 0 {
		return maxGCPercent
	}
	return int(min((float64(minHeap)/float64(live)-1)*100, maxGCPercent))
}

// maxGCPercent bounds the percentage: a heap goal of 101 × what is live.
const maxGCPercent = 10000

// startGCFloor starts the floor; minHeap 0, or GOGC in the environment,
// starts nothing. stop restores the default.
func startGCFloor(minHeap uint64) (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set || minHeap == 0 {
		return func() {}
	}
	g := &gcFloor{minHeap: minHeap, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	// Before the first cycle the live heap is unknown; the runtime's own
	// minimum heap goal (4 MiB at GOGC=100) scales with the percentage.
	debug.SetGCPercent(gcPercentFor(4<<20, minHeap))
	g.arm()
	return func() {
		g.stopped.Store(true)
		debug.SetGCPercent(100)
	}
}

// gcSentinel is an object made unreachable on purpose: its finalizer runs
// once a collection has found it so, that is after every cycle.
type gcSentinel struct{ g *gcFloor }

func (g *gcFloor) arm() {
	runtime.SetFinalizer(&gcSentinel{g: g}, func(s *gcSentinel) {
		if s.g.stopped.Load() {
			return
		}
		s.g.adjust()
		s.g.arm()
	})
}

// adjust sets the percentage from the live heap of the last cycle.
func (g *gcFloor) adjust() {
	metrics.Read(g.sample)
	if g.sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	debug.SetGCPercent(gcPercentFor(g.sample[0].Value.Uint64(), g.minHeap))
}
