//go:build linux

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDrainWaitReturnsAfterTheStreams: `pdplane peers drain d0 --wait` on a
// decode with streams in flight (a token every shutdownTokenTime) returns
// only once they have finished and the engine's load says so, and says it
// is safe to stop.
func TestDrainWaitReturnsAfterTheStreams(t *testing.T) {
	t.Parallel()
	_, base := shutdownFleet(t, time.Minute)
	streams := []*sseStream{startCompletion(t, base, 12), startCompletion(t, base, 16)}
	var out bytes.Buffer
	err := peersGroup(&out).run(context.Background(), []string{"drain", "d0", "--wait", "--timeout", "1m", "--control-plane", base})
	returned := time.Now()
	if err != nil {
		t.Fatalf("peers drain --wait: %v\n%s", err, out.String())
	}
	for i, s := range streams {
		select {
		case <-s.done:
		default:
			t.Fatalf("drain --wait returned while stream %d was still in flight:\n%s", i, out.String())
		}
		if s.err != nil || len(s.lines) == 0 || !strings.Contains(strings.Join(s.lines, "\n"), "[DONE]") || s.ended.After(returned) {
			t.Fatalf("stream %d: err %v, ended %v (drain returned %v), lines %q", i, s.err, s.ended, returned, s.lines)
		}
	}
	if !strings.Contains(out.String(), "d0 is drained: nothing in flight, safe to stop") || !strings.Contains(out.String(), "waiting:") {
		t.Fatalf("drain --wait said:\n%s", out.String())
	}
}
