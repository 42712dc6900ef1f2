package router

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pdplane/pdplane/httpwire"
)

// errPrefillTimeout ends an attempt whose prefill leg ran past
// PrefillTimeout; it counts as the prefill failing first.
var errPrefillTimeout = fmt.Errorf("%w: it ran past its timeout", errPrefillLegFailed)

// attemptCtx is the context of one attempt's legs. It ends when the
// attempt does (cancel), when one leg fails (cancelling the other), when
// the prefill's timeout or the decode's first-byte deadline passes, or
// when the client's request ends (its parent). It does the work of
// context.WithCancelCause, a WithTimeout for the prefill and a
// context.AfterFunc per leg in one object: the legs' hooks (the
// transport's, closing their connections) sit in a small array rather
// than as children in maps, and the two deadlines are timers that end it
// with their cause.
//
// A stream's request context, detached from net/http's (detachable), is
// one too (newDetachedCtx): without its parent's values, and with a watch
// on the parent that detach ends. An attempt under it then hooks into it
// directly.
//
// Its cause (Cause) says which of these ended it; context.Cause does not
// see it, finding the nearest context made by the context package (the
// request's), and a context the context package derives from it (net/http's
// transport's, a dialer's) takes its Err for a cause. Such a context ends
// with it through its AfterFunc; a leg's span is put in a hookedCtx so that
// it keeps the method.
type attemptCtx struct {
	parent context.Context // nil for a detached one: none of its values or deadline

	mu             sync.Mutex
	done           chan struct{} // made on the first Done
	err            error
	cause          error
	parentHook     httpwire.Hooked // the watch on parent
	httpwire.Hooks                 // AfterFunc's and hook's, run when it ends

	prefillTimer *time.Timer
	prefillOver  bool // the prefill leg ended: its timeout no longer applies
	fbTimer      *time.Timer
	fbSeen       bool // the decode sent its first byte: its deadline no longer applies
}

// hookedCtx is a context derived from an attemptCtx (a leg's span put in
// it) that takes AfterFunc hooks into the attemptCtx itself: the context
// package's wrappers hide the method, and context.AfterFunc, or a
// WithCancel or WithTimeout, on such a context would watch the attempt
// with a goroutine of its own, which a stream held open keeps for its
// life. It ends with the attemptCtx, which is all that ends it.
type hookedCtx struct {
	context.Context
	*httpwire.Hooks // the attemptCtx's
}

// closedDone is the Done of an attemptCtx that ended before anyone asked.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// newAttemptCtx starts an attempt's context under parent.
func newAttemptCtx(parent context.Context) *attemptCtx {
	a := &attemptCtx{parent: parent}
	a.watch(parent)
	return a
}

// newDetachedCtx is a request's context that outlives parent, net/http's
// (which ends with the handler), and ends with it until unwatch: it has
// none of parent's values, so that a stream held open does not keep what
// the middleware put there once unwatched.
func newDetachedCtx(parent context.Context) *attemptCtx {
	a := &attemptCtx{}
	a.watch(parent)
	return a
}

// watch ends a when parent ends, with its error and cause.
func (a *attemptCtx) watch(parent context.Context) {
	if err := parent.Err(); err != nil {
		a.end(err, causeOf(parent), nil)
		return
	}
	// A request the front serves is watched through its own hooks, under
	// whatever values were put on it; an attemptCtx is a Hooker itself,
	// and asking it for a value or its Done would cost it for nothing.
	h := httpwire.OnDone(httpwire.HookTarget(parent), func() { a.end(parent.Err(), causeOf(parent), nil) })
	a.mu.Lock()
	a.parentHook = h
	a.mu.Unlock()
}

// causeOf is ctx's cause, an attemptCtx's included.
func causeOf(ctx context.Context) error {
	if a, ok := ctx.(*attemptCtx); ok {
		return a.Cause()
	}
	return context.Cause(ctx)
}

// unwatch stops ending a with its parent, and lets go of the parent;
// false when the parent had ended it already (or it was unwatched).
func (a *attemptCtx) unwatch() bool {
	a.mu.Lock()
	h := a.parentHook
	a.parentHook = httpwire.Hooked{}
	a.mu.Unlock()
	return h.Stop()
}

func (a *attemptCtx) Deadline() (time.Time, bool) {
	if a.parent == nil {
		return time.Time{}, false
	}
	return a.parent.Deadline()
}

func (a *attemptCtx) Value(key any) any {
	if a.parent == nil {
		return nil
	}
	return a.parent.Value(key)
}

func (a *attemptCtx) Done() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		if a.err != nil {
			a.done = closedDone
		} else {
			a.done = make(chan struct{})
		}
	}
	return a.done
}

func (a *attemptCtx) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Cause is what ended the attempt (nil while it runs): the cause given to
// cancel, errPrefillTimeout, errDecodeFirstByte, or the request's own.
func (a *attemptCtx) Cause() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cause
}

// cancel ends the attempt with cause (context.Canceled when nil), as a
// context.CancelCauseFunc does.
func (a *attemptCtx) cancel(cause error) { a.end(context.Canceled, cause, nil) }

// end ends the attempt with err and cause, unless it has ended or unless
// *unless (a deadline's: its leg is past it) is set. Its hooks run, its
// timers stop, and its watch on the request ends.
func (a *attemptCtx) end(err, cause error, unless *bool) {
	if cause == nil {
		cause = err
	}
	a.mu.Lock()
	if a.err != nil || unless != nil && *unless {
		a.mu.Unlock()
		return
	}
	a.err, a.cause = err, cause
	if a.done != nil {
		close(a.done)
	}
	parent, pt, ft := a.parentHook, a.prefillTimer, a.fbTimer
	a.parentHook = httpwire.Hooked{}
	a.mu.Unlock()
	a.Fire()
	parent.Stop()
	for _, t := range [...]*time.Timer{pt, ft} {
		if t != nil {
			t.Stop()
		}
	}
}

// limitPrefill ends the attempt with errPrefillTimeout after d, unless
// prefillDone comes first.
func (a *attemptCtx) limitPrefill(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil || a.prefillOver {
		return // a timer would only keep the attempt until it fired
	}
	a.prefillTimer = time.AfterFunc(d, a.prefillTimedOut)
}

func (a *attemptCtx) prefillTimedOut() {
	a.end(context.DeadlineExceeded, errPrefillTimeout, &a.prefillOver)
}

// prefillDone lifts the prefill's timeout: its leg has ended.
func (a *attemptCtx) prefillDone() {
	a.mu.Lock()
	a.prefillOver = true
	t := a.prefillTimer
	a.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

// armFirstByte bounds how long a streamed decode may stay silent once its
// prefill has answered in full: SGLang's decode, when the KV it waits for
// never comes, waits out SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s by
// default) before it aborts, and a decode that hangs would hold the client
// for ever. When d passes before the decode's first byte (firstByte), the
// attempt ends with errDecodeFirstByte, which counts as a failure of the
// pair. d <= 0 arms nothing.
func (a *attemptCtx) armFirstByte(d time.Duration) {
	if d <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fbSeen || a.fbTimer != nil || a.err != nil {
		return
	}
	a.fbTimer = time.AfterFunc(d, a.firstByteLate)
}

func (a *attemptCtx) firstByteLate() {
	a.end(context.Canceled, errDecodeFirstByte, &a.fbSeen)
}

// firstByte records that the decode sent something.
func (a *attemptCtx) firstByte() {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.fbSeen {
		a.mu.Unlock()
		return
	}
	a.fbSeen = true
	t := a.fbTimer
	a.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}
