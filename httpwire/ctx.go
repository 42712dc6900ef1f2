package httpwire

import (
	"context"
	"sync"
)

// Contexts that end without the context package's bookkeeping. A
// request's legs hook onto its context's end (to close their
// connections), and on a stream held open for minutes every such hook
// made through context.AfterFunc is a child in a map; a Hooker keeps them
// in a small array instead, by index.

// Hooker is a context that keeps hooks to run when it ends by index (Hook
// returns -1, and runs f at once in its own goroutine, when it has ended):
// no stop function is made per hook, as its AfterFunc, which the context
// package calls, must.
type Hooker interface {
	Hook(f func()) int
	Unhook(i int) bool
}

// Hooked is f hooked on a context's end (OnDone): on a Hooker by index,
// on any other context through context.AfterFunc.
type Hooked struct {
	h      Hooker
	i      int
	stopFn func() bool
}

// OnDone runs f in its own goroutine when ctx ends.
func OnDone(ctx context.Context, f func()) Hooked {
	if h, ok := ctx.(Hooker); ok {
		return Hooked{h: h, i: h.Hook(f)}
	}
	return Hooked{stopFn: context.AfterFunc(ctx, f)}
}

// Stop unhooks f: true when that kept it from running (false also for
// the zero Hooked).
func (c Hooked) Stop() bool {
	switch {
	case c.h != nil:
		return c.h.Unhook(c.i)
	case c.stopFn != nil:
		return c.stopFn()
	}
	return false
}

// Hooks are the hooks of a Hooker (embed it: the router's attempt
// contexts, the front's request contexts), run each in its own goroutine
// when it ends (Fire): a small array (an attempt has two legs), then a
// slice. A slot is never reused, so that a stop called twice stops nothing
// else. Its lock is its own: a hook added while the context ends is
// either run by Fire or, after it, at once.
type Hooks struct {
	mu    sync.Mutex
	fired bool
	n     int
	array [2]func()
	more  []func()
}

// AfterFunc runs f in its own goroutine once the context ends, as
// context.AfterFunc does (which calls it); stop unregisters f, true when
// that kept it from running.
func (h *Hooks) AfterFunc(f func()) (stop func() bool) {
	i := h.Hook(f)
	return func() bool { return i >= 0 && h.Unhook(i) }
}

// Hook keeps f and returns its index for Unhook; -1, and f run at once in
// its own goroutine, when the context has ended.
func (h *Hooks) Hook(f func()) int {
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

// Unhook drops hook i; false when it was dropped or has run.
func (h *Hooks) Unhook(i int) bool {
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

// Pending is the number of hooks kept and not yet run or unhooked.
func (h *Hooks) Pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, f := range append(h.array[:], h.more...) {
		if f != nil {
			n++
		}
	}
	return n
}

// Fire runs the hooks, once.
func (h *Hooks) Fire() {
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

	Hooks // AfterFunc's and hook's, run when the front cancels it
}

// requestCtxKey finds a requestCtx under the values put on it.
type requestCtxKey struct{}

// NewRequestContext returns a request context of the kind the front makes
// (a Hooker that context.Cause still reads) and the function that ends it
// and runs its hooks: for servers of the router's requests other than the
// front, and tests.
func NewRequestContext() (context.Context, context.CancelCauseFunc) {
	r := newRequestCtx()
	return r, r.cancel
}

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

// HookTarget is the context to hook onto (OnDone) to learn when ctx ends:
// ctx itself when it is a Hooker, the context the front made for the
// request when ctx ends exactly when that one does (only values put on it
// in between), else ctx.
func HookTarget(ctx context.Context) context.Context {
	if _, ok := ctx.(Hooker); ok {
		return ctx
	}
	if r := frontRequestCtx(ctx); r != nil {
		return r
	}
	return ctx
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
	r.Fire()
}
