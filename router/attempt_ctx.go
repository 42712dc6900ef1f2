package router

import (
	"context"
	"fmt"
	"sync"
	"time"
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

	mu         sync.Mutex
	done       chan struct{} // made on the first Done
	err        error
	cause      error
	parentHook ctxHook // the watch on parent
	ctxHooks           // AfterFunc's and hook's, run when it ends

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
	*ctxHooks // the attemptCtx's
}

// hooker is a context of the router's own, which keeps hooks to run when
// it ends by index (hook returns -1, and runs f at once in its own
// goroutine, when it has ended): no stop function is made per hook, as
// its AfterFunc, which the context package calls, must.
type hooker interface {
	hook(f func()) int
	unhook(i int) bool
}

// ctxHook is f hooked on a context's end (hookOn): on a hooker by index,
// on any other context through context.AfterFunc.
type ctxHook struct {
	h      hooker
	i      int
	stopFn func() bool
}

// hookOn runs f in its own goroutine when ctx ends.
func hookOn(ctx context.Context, f func()) ctxHook {
	if h, ok := ctx.(hooker); ok {
		return ctxHook{h: h, i: h.hook(f)}
	}
	return ctxHook{stopFn: context.AfterFunc(ctx, f)}
}

// stop unhooks f: true when that kept it from running (false also for
// the zero ctxHook).
func (c ctxHook) stop() bool {
	switch {
	case c.h != nil:
		return c.h.unhook(c.i)
	case c.stopFn != nil:
		return c.stopFn()
	}
	return false
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
	// whatever values were put on it (frontRequestCtx); an attemptCtx is
	// a hooker itself, and asking it for a value or its Done would cost
	// it for nothing.
	on := parent
	if _, own := parent.(*attemptCtx); !own {
		if r := frontRequestCtx(parent); r != nil {
			on = r
		}
	}
	h := hookOn(on, func() { a.end(parent.Err(), causeOf(parent), nil) })
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
	a.parentHook = ctxHook{}
	a.mu.Unlock()
	return h.stop()
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

// ctxHooks are the hooks of a context of the router's own (attemptCtx,
// requestCtx), run each in its own goroutine when it ends (fire): a small
// array (an attempt has two legs), then a slice. A slot is never reused, so
// that a stop called twice stops nothing else. Its lock is its own: a hook
// added while the context ends is either run by fire or, after it, at once.
type ctxHooks struct {
	mu    sync.Mutex
	fired bool
	n     int
	array [2]func()
	more  []func()
}

// AfterFunc runs f in its own goroutine once the context ends, as
// context.AfterFunc does (which calls it); stop unregisters f, true when
// that kept it from running.
func (h *ctxHooks) AfterFunc(f func()) (stop func() bool) {
	i := h.hook(f)
	return func() bool { return i >= 0 && h.unhook(i) }
}

// hook keeps f and returns its index for unhook; -1, and f run at once in
// its own goroutine, when the context has ended.
func (h *ctxHooks) hook(f func()) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fired {
		go f()
		return -1
	}
	if h.n < len(h.array) {
		h.array[h.n] = f
	} else {
		h.more = append(h.more, f)
	}
	h.n++
	return h.n - 1
}

// unhook drops hook i; false when it was dropped or has run.
func (h *ctxHooks) unhook(i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	var slot *func()
	switch {
	case i < 0:
		return false
	case i < len(h.array):
		slot = &h.array[i]
	case i-len(h.array) < len(h.more):
		slot = &h.more[i-len(h.array)]
	default:
		return false
	}
	if *slot == nil {
		return false
	}
	*slot = nil
	return true
}

// fire runs the hooks, once.
func (h *ctxHooks) fire() {
	h.mu.Lock()
	if h.fired {
		h.mu.Unlock()
		return
	}
	h.fired = true
	array, more := h.array, h.more
	h.array, h.more = [2]func(){}, nil
	h.mu.Unlock()
	for _, f := range append(array[:], more...) {
		if f != nil {
			go f()
		}
	}
}

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
	a.parentHook = ctxHook{}
	a.mu.Unlock()
	a.fire()
	parent.stop()
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

// requestCtx is the context of a request the front serves. It is a
// context.WithCancelCause's (so that context.Cause finds its cause, and
// the context package's children of it work as ever), cancelled only by
// the front, which runs the hooks given to its AfterFunc then too: an
// attempt's context, or a stream's detached one, watches the request
// through them (watch) rather than through context.AfterFunc, which would
// make the request's context a map of children for it.
type requestCtx struct {
	context.Context
	cancelInner context.CancelCauseFunc

	ctxHooks // AfterFunc's and hook's, run when the front cancels it
}

// requestCtxKey finds a requestCtx under the values put on it.
type requestCtxKey struct{}

func newRequestCtx() *requestCtx {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &requestCtx{Context: ctx, cancelInner: cancel}
}

func (r *requestCtx) Value(key any) any {
	if key == (requestCtxKey{}) {
		return r
	}
	return r.Context.Value(key)
}

// frontRequestCtx is the requestCtx ctx derives from, when it ends exactly
// when that one does (only values put on it in between), else nil.
func frontRequestCtx(ctx context.Context) *requestCtx {
	r, ok := ctx.Value(requestCtxKey{}).(*requestCtx)
	if !ok || ctx.Done() != r.Done() {
		return nil
	}
	return r
}

// cancel ends the request with cause, then runs its hooks, each in its own
// goroutine.
func (r *requestCtx) cancel(cause error) {
	r.cancelInner(cause)
	r.fire()
}
