package httpwire

import "testing"

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
