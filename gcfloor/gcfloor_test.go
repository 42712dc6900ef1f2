package gcfloor

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, scan, min uint64
		want            int
	}{
		// 16 + (16 + 0.5) × 2.9 ≈ 64 MiB
		{16 * mib, mib / 2, 64 * mib, 290},
		// 4 + (4 + 1) × 12 = 64 MiB, above the 1600 whose minimum is 64 MiB: capped
		{4 * mib, mib, 64 * mib, 1200},
		{mib, mib, 64 * mib, 1600},
		{0, 0, 64 * mib, 1600},
		// 32 + 33 × 0.97 < 64 still, but never below the default
		{31 * mib, mib, 64 * mib, 103},
		{32 * mib, mib, 64 * mib, 100},
		{500 * mib, mib, 64 * mib, 100},
		// a floor under the runtime's own minimum: the default
		{0, 0, 2 * mib, 100},
	} {
		if got := percentFor(tc.live, tc.scan, tc.min); got != tc.want {
			t.Errorf("percentFor(%d, %d, %d MiB) = %d, want %d", tc.live, tc.scan, tc.min/mib, got, tc.want)
		}
	}
}

// heapGoal is the runtime's heap goal at percentage p (runtime/mgcpacer.go).
func heapGoal(live, scan uint64, p int) uint64 {
	return max(live+(live+scan)*uint64(p)/100, runtimeHeapMinimum*uint64(p)/100)
}

// The goal the percentage gives is the floor, never much above it, for
// any live heap below half of it; above, it is the default's.
func TestGCPercentForPutsTheGoalAtTheFloor(t *testing.T) {
	const mib = 1 << 20
	const floor = 64 * mib
	for live := uint64(0); live <= 40*mib; live += mib / 4 {
		for _, scan := range []uint64{0, mib / 2, 4 * mib} {
			p := percentFor(live, scan, floor)
			goal := heapGoal(live, scan, p)
			switch {
			case live+(live+scan) >= floor:
				if p != 100 {
					t.Errorf("live %d, scan %d: percentage %d, want the default", live, scan, p)
				}
			case goal < floor-mib || goal > floor+mib/64:
				t.Errorf("live %d, scan %d: percentage %d gives a goal of %.1f MiB, want %d", live, scan, p, float64(goal)/mib, floor/mib)
			}
		}
	}
}

// gogc is the collector's percentage now.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// collectUntil runs collections (each runs the floor's finalizer after it)
// until ok holds, for up to 10 s.
func collectUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GOGC is %d", what, gogc())
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// finalized runs a collection and waits for the finalizer of a sentinel of
// its own, which that collection finds unreachable. Finalizers run one at a
// time on one goroutine: once a second call returns, those queued by the
// first call's collection have run too.
func finalized(t *testing.T) {
	t.Helper()
	ran := make(chan struct{})
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) { close(ran) })
	runtime.GC()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("a collection's finalizers did not run")
	}
}

// The floor raises the percentage while little is live, and gives the
// default back once half of the floor is live, and when stopped. Not
// parallel: it sets the process's collector.
func TestGCFloorFollowsTheLiveHeap(t *testing.T) {
	if v, set := os.LookupEnv("GOGC"); set {
		t.Setenv("GOGC", v) // restored after the test
		os.Unsetenv("GOGC")
	}
	const floor = 256 << 20
	before := gogc()
	stop := Start(floor)
	defer stop()
	collectUntil(t, "a small live heap raises the percentage", func() bool { return gogc() > 200 })

	live := make([][]byte, 0, 160)
	for range cap(live) {
		live = append(live, make([]byte, 1<<20)) // 160 MiB live: above half the floor
	}
	collectUntil(t, "a live heap above half the floor gives the default", func() bool { return gogc() == 100 })
	runtime.KeepAlive(live)
	live = nil

	collectUntil(t, "a small live heap again raises it again", func() bool { return gogc() > 200 })
	stop()
	if got := gogc(); got != before {
		t.Errorf("GOGC after stop = %d, want %d as before", got, before)
	}
	finalized(t) // a cycle: it finds the floor's sentinel
	finalized(t) // and one more: the sentinel's finalizer has run
	if got := gogc(); got != before {
		t.Errorf("GOGC a cycle after stop = %d, want %d: the finalizer still runs", got, before)
	}
}
