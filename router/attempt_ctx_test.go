package router

import (
	"context"

	"github.com/pdplane/pdplane/httpwire"

	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// waitDone fails t unless ch is closed within a few seconds.
func waitDone(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not done", what)
	}
}

// wantRunning fails t if a ends within d. In a synctest bubble the wait
// takes no real time: the bubble's clock moves on once every goroutine in
// it is blocked.
func wantRunning(t *testing.T, what string, a *attemptCtx, d time.Duration) {
	t.Helper()
	select {
	case <-a.Done():
		t.Fatalf("%s: %v", what, a.Cause())
	case <-time.After(d):
	}
}

// TestAttemptCtx pins the attempt's context against what the context
// package's WithCancelCause, WithTimeout and AfterFunc did for it.
func TestAttemptCtx(t *testing.T) {
	cause := errors.New("the decode leg failed")

	t.Run("cancel", func(t *testing.T) {
		a := newAttemptCtx(context.Background())
		ran := make(chan struct{})
		stopRun := context.AfterFunc(a, func() { close(ran) })
		stopped := context.AfterFunc(a, func() { t.Error("a stopped hook ran") })
		if !stopped() || stopped() {
			t.Fatal("stop: want true once, then false")
		}
		byIndex := httpwire.OnDone(a, func() { t.Error("a stopped hook ran") })
		if !byIndex.Stop() || byIndex.Stop() || (httpwire.Hooked{}).Stop() {
			t.Fatal("Hooked.Stop: want true once, then false; false for none")
		}
		direct := make(chan struct{})
		httpwire.OnDone(a, func() { close(direct) }) // the transport's: by index
		child, cancelChild := context.WithCancel(a)
		defer cancelChild()
		derived := context.WithValue(a, attemptKey{}, 1) // a leg's span: not the context package's cancelCtx
		viaDerived := make(chan struct{})
		context.AfterFunc(derived, func() { close(viaDerived) })
		if a.Err() != nil || a.Cause() != nil {
			t.Fatal("ended before cancel")
		}
		a.cancel(cause)
		a.cancel(errAttemptOver) // the first cause stays
		waitDone(t, "Done", a.Done())
		waitDone(t, "a hook", ran)
		waitDone(t, "a hook given directly", direct)
		waitDone(t, "a child", child.Done())
		waitDone(t, "a hook of a derived context", viaDerived)
		if !errors.Is(a.Err(), context.Canceled) || a.Cause() != cause || stopRun() {
			t.Fatalf("err %v, cause %v", a.Err(), a.Cause())
		}
		late, lateByIndex := make(chan struct{}), make(chan struct{})
		if context.AfterFunc(a, func() { close(late) })() || httpwire.OnDone(a, func() { close(lateByIndex) }).Stop() {
			t.Fatal("a hook after the end was stopped before it ran")
		}
		waitDone(t, "a hook after the end", late)
		waitDone(t, "a hook by index after the end", lateByIndex)
	})

	t.Run("a leg's span", func(t *testing.T) {
		// Hooks on a context carrying a leg's span (a hookedCtx) go into
		// the attempt: no goroutine watches it per hook, as the context
		// package would for a context whose AfterFunc a wrapper hides.
		a := newAttemptCtx(context.Background())
		leg := hookedCtx{context.WithValue(a, attemptKey{}, 4), &a.Hooks}
		before := runtime.NumGoroutine()
		ran := make(chan struct{}, 200)
		var children []context.Context
		for range 100 {
			httpwire.OnDone(leg, func() { ran <- struct{}{} })
			child, cancelChild := context.WithTimeout(leg, time.Minute) // a dialer's, the vLLM prefill's
			defer cancelChild()
			children = append(children, child)
		}
		if n := runtime.NumGoroutine() - before; n > 10 {
			t.Fatalf("%d goroutines for 100 hooks and 100 children", n)
		}
		if leg.Value(attemptKey{}) != 4 {
			t.Fatal("the span's values are lost")
		}
		a.cancel(cause)
		for range 100 {
			waitDone(t, "a hook", func() <-chan struct{} { c := make(chan struct{}); go func() { <-ran; close(c) }(); return c }())
		}
		for _, c := range children {
			waitDone(t, "a child", c.Done())
		}
	})

	t.Run("request ends", func(t *testing.T) {
		req, end := context.WithCancelCause(context.Background())
		a := newAttemptCtx(context.WithValue(req, attemptKey{}, 2))
		if a.Value(attemptKey{}) != 2 {
			t.Fatal("values are the request's")
		}
		end(errClientClosed)
		waitDone(t, "Done", a.Done())
		if !errors.Is(a.Err(), context.Canceled) || a.Cause() != errClientClosed {
			t.Fatalf("err %v, cause %v", a.Err(), a.Cause())
		}
		gone := newAttemptCtx(req) // under a request already ended
		if gone.Cause() != errClientClosed {
			t.Fatalf("an attempt under an ended request: cause %v", gone.Cause())
		}
		waitDone(t, "Done", gone.Done())
	})

	t.Run("the front's request", func(t *testing.T) {
		// An attempt (or a detached context) under the front's request
		// context, through the values the middleware put on it, watches it
		// through its hooks; context.Cause still finds the request's cause.
		r, cancelRequest := httpwire.NewRequestContext()
		withValues := context.WithValue(context.WithValue(r, attemptKey{}, 5), attemptKey{}, 6)
		if httpwire.HookTarget(withValues) != r {
			t.Fatal("the request under its values is not the context to hook on")
		}
		a, d := newAttemptCtx(withValues), newDetachedCtx(withValues)
		if hooked := r.(interface{ Pending() int }).Pending(); hooked != 2 {
			t.Fatalf("%d hooks on the request, want 2 (the attempt's and the detached context's)", hooked)
		}
		between, cancelBetween := context.WithCancel(withValues)
		defer cancelBetween()
		if httpwire.HookTarget(between) != between {
			t.Fatal("a context that may end before the request's was taken for it")
		}
		ended := newAttemptCtx(withValues)
		ended.cancel(errAttemptOver) // its hook goes: the request's cancel does not run it
		cancelRequest(errClientClosed)
		waitDone(t, "the attempt", a.Done())
		waitDone(t, "the detached context", d.Done())
		waitDone(t, "a child of the request", between.Done())
		if context.Cause(withValues) != errClientClosed || a.Cause() != errClientClosed || d.Cause() != errClientClosed ||
			ended.Cause() != errAttemptOver {
			t.Fatalf("causes: request %v, attempt %v, detached %v, ended attempt %v",
				context.Cause(withValues), a.Cause(), d.Cause(), ended.Cause())
		}
		late := newAttemptCtx(withValues) // under a request already ended
		if late.Cause() != errClientClosed {
			t.Fatalf("an attempt under an ended request: %v", late.Cause())
		}
	})

	t.Run("detached", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			req, end := context.WithCancelCause(context.WithValue(context.Background(), attemptKey{}, 3))
			d := newDetachedCtx(req)
			if d.Value(attemptKey{}) != nil {
				t.Fatal("a detached context carries its parent's values")
			}
			a := newAttemptCtx(d) // hooked into d itself
			end(errClientClosed)
			waitDone(t, "the detached context", d.Done())
			waitDone(t, "the attempt under it", a.Done())
			if d.Cause() != errClientClosed || a.Cause() != errClientClosed || d.unwatch() {
				t.Fatalf("causes %v, %v; or unwatched after its parent ended it", d.Cause(), a.Cause())
			}

			req, end = context.WithCancelCause(context.Background())
			d = newDetachedCtx(req)
			if !d.unwatch() || d.unwatch() {
				t.Fatal("unwatch: want true once, then false")
			}
			end(errClientClosed)
			synctest.Wait() // what the parent's end set off has run
			if d.Err() != nil {
				t.Fatal("an unwatched context ended with its parent")
			}
			a = newAttemptCtx(d)
			d.cancel(errStreamCut)
			waitDone(t, "the attempt under a cancelled detached context", a.Done())
			if a.Cause() != errStreamCut {
				t.Fatalf("the attempt's cause %v, want its parent's", a.Cause())
			}
		})
	})

	t.Run("prefill timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newAttemptCtx(context.Background())
			a.limitPrefill(20 * time.Millisecond)
			waitDone(t, "Done", a.Done())
			if !errors.Is(a.Err(), context.DeadlineExceeded) || a.Cause() != errPrefillTimeout || !errors.Is(a.Cause(), errPrefillLegFailed) {
				t.Fatalf("err %v, cause %v", a.Err(), a.Cause())
			}
			b := newAttemptCtx(context.Background())
			b.limitPrefill(200 * time.Millisecond)
			b.prefillDone()
			wantRunning(t, "the prefill's timeout ended the attempt after its leg", b, 300*time.Millisecond)
		})
	})

	t.Run("first byte", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := newAttemptCtx(context.Background())
			a.armFirstByte(20 * time.Millisecond)
			waitDone(t, "Done", a.Done())
			if !errors.Is(a.Err(), context.Canceled) || a.Cause() != errDecodeFirstByte {
				t.Fatalf("err %v, cause %v", a.Err(), a.Cause())
			}
			b := newAttemptCtx(context.Background())
			b.armFirstByte(200 * time.Millisecond)
			b.firstByte()
			c := newAttemptCtx(context.Background())
			c.firstByte() // before the deadline is armed: it is not
			c.armFirstByte(20 * time.Millisecond)
			wantRunning(t, "the first-byte deadline ended an attempt after its byte", b, 300*time.Millisecond)
			if b.Err() != nil || c.Err() != nil {
				t.Fatalf("the first-byte deadline ended an attempt after its byte: %v, %v", b.Cause(), c.Cause())
			}
			var none *attemptCtx
			none.firstByte() // outside an attempt: nothing
		})
	})
}

type attemptKey struct{}

// Causes a request's context may end with.
var (
	errClientClosed = errors.New("the client closed its connection")
	errStreamCut    = errors.New("the router cut the stream")
)
