package main

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
		live, min uint64
		want      int
	}{
		{4 * mib, 64 * mib, 1500}, // a goal of 4 × 16 = 64 MiB
		{16 * mib, 64 * mib, 300},
		{31 * mib, 64 * mib, 106},
		{32 * mib, 64 * mib, 100}, // half of the floor live: the default
		{500 * mib, 64 * mib, 100},
		{mib / 4, 64 * mib, maxGCPercent}, // bounded
		{0, 64 * mib, maxGCPercent},
	} {
		if got := gcPercentFor(tc.live, tc.min); got != tc.want {
			t.Errorf("gcPercentFor(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.min/mib, got, tc.want)
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

// The floor raises the percentage while little is live, and gives the
// default back once half of the floor is live, and when stopped. Not
// parallel: it sets the process's collector.
func TestGCFloorFollowsTheLiveHeap(t *testing.T) {
	if v, set := os.LookupEnv("GOGC"); set {
		t.Setenv("GOGC", v) // restored after the test
		os.Unsetenv("GOGC")
	}
	const floor = 256 << 20
	stop := startGCFloor(floor)
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
	if got := gogc(); got != 100 {
		t.Errorf("GOGC after stop = %d, want 100", got)
	}
	runtime.GC()
	time.Sleep(20 * time.Millisecond)
	if got := gogc(); got != 100 {
		t.Errorf("GOGC a cycle after stop = %d, want 100: the finalizer still runs", got)
	}
}
