package router

import (
	"context"
	"sync"
	"time"
)

// firstByteDeadline bounds how long a streamed decode may stay silent once
// its prefill has answered in full: SGLang's decode, when the KV it waits
// for never comes, waits out SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s by
// default) before it aborts, and a decode that hangs would hold the client
// for ever. When the deadline passes it cancels the attempt with
// errDecodeFirstByte, which counts as a failure of the pair.
//
// It is armed once the prefill succeeded and disarmed by the decode's first
// byte, whichever comes first.
type firstByteDeadline struct {
	mu    sync.Mutex
	timer *time.Timer
	seen  bool
}

// arm starts the deadline unless the first byte is already in; d <= 0 arms
// nothing.
func (fb *firstByteDeadline) arm(d time.Duration, cancel context.CancelCauseFunc) {
	if fb == nil || d <= 0 {
		return
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.seen || fb.timer != nil {
		return
	}
	fb.timer = time.AfterFunc(d, func() {
		fb.mu.Lock()
		seen := fb.seen
		fb.mu.Unlock()
		if !seen {
			cancel(errDecodeFirstByte)
		}
	})
}

// firstByte records that the decode sent something.
func (fb *firstByteDeadline) firstByte() {
	if fb == nil {
		return
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.seen = true
	if fb.timer != nil {
		fb.timer.Stop()
	}
}

// stop ends the deadline with the attempt.
func (fb *firstByteDeadline) stop() { fb.firstByte() }
