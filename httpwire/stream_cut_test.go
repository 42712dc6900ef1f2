//go:build linux

package httpwire

import (
	"net"
	"testing"
	"time"
)

// CloseDetached cuts running streams only: a connection whose stream has
// ended may already be back with the server (handed back, or parked for
// the client's next request) and is left alone.
func TestCutLeavesEndedStreamsAlone(t *testing.T) {
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err) // Linux only: elsewhere streams are never taken over
	}
	defer w.Stop()
	for _, tc := range []struct {
		state    takenState
		wantCut  bool
		stateNow takenState
	}{
		{takenStreaming, true, takenDone},
		{takenIdle, false, takenIdle},
		{takenDone, false, takenDone},
	} {
		a, b := net.Pipe()
		cancelled := false
		c := &Stream{c: a, w: a, cw: w, state: tc.state, cancel: func(error) { cancelled = true }}
		c.cut()
		err := a.SetDeadline(time.Now().Add(time.Second)) // io.ErrClosedPipe once a is closed (b is open)
		closed := err != nil
		if cancelled != tc.wantCut || closed != tc.wantCut || c.state != tc.stateNow {
			t.Errorf("state %v: cancelled %v, closed %v (%v), state now %v; want cut %v, state %v",
				tc.state, cancelled, closed, err, c.state, tc.wantCut, tc.stateNow)
		}
		_, _ = a.Close(), b.Close()
	}
}
