package httpwire

import (
	"testing"
	"time"
)

// testWatcher is a Watcher stopped when the test ends.
func testWatcher(tb testing.TB) *Watcher {
	tb.Helper()
	w, err := NewWatcher()
	if err != nil {
		tb.Fatalf("no connection watcher (Linux's epoll): %v", err)
	}
	tb.Cleanup(w.Stop)
	return w
}

// waitFor polls cond until it holds, failing tb after 10 s. (httpwire's
// tests import no other pdplane package: sim imports httpwire.)
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // a poll with a deadline
	}
}
