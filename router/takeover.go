package router

import (
	"context"
	"errors"
	"net/http"
	"runtime/debug"

	"github.com/pdplane/pdplane/httpwire"
)

// Connection takeover (httpwire.TakeOver). A streamed answer whose
// decode turns out to be slow (a wait for its next bytes passed
// slowStreamWait: a queued, held or slowly generating request, whose
// stream may stay open for minutes) leaves net/http: the dispatch takes
// the client's connection over and writes the rest of the chunked answer
// to it itself, and the handler returns, so that net/http's goroutine and
// buffers are released for the stream's whole life. The request still
// counts against --max-inflight and in the router's in-flight gauge, its
// span and `request` line end with the stream, and a shutdown waits for
// it (Router.Detached) and cuts what is left (Router.CloseDetached).
//
// The cost is a goroutine per stream request (the dispatch runs beside the
// handler, which waits for it, so that the handler can return early); a
// stream that generates at speed is never taken over and finishes on
// net/http's connection.

// takeover takes the client's connection off net/http: see the top of this
// file. It is called only on the dispatch's own goroutine (d.hop set, which
// serve does only with a watcher and takeover enabled); false leaves the stream on
// net/http (the connection cannot be hijacked).
func (d *dispatch) takeover() bool {
	// From the hijack on, the request's context is the router's:
	// net/http cancels its own as soon as the handler returns.
	tk, ok := httpwire.TakeOver(&d.rc, d.r, d.rt.watcher, d.detach)
	if !ok {
		return false
	}
	// net/http's request, response and connection (its buffers, the
	// request's headers and body reader) are garbage from here.
	d.tk, d.w, d.rc, d.r = tk, nil, http.ResponseController{}, nil
	d.rt.taken.Add(tk)
	d.rt.m.takenOver.Inc()
	d.hop <- hopTaken
	if err := tk.Watch(); err != nil {
		d.rt.log.Warn().Err(err).Str(logRequestID, d.rid).Msg("cannot watch a taken-over connection")
	}
	return true
}

// Detached is the number of streams running on connections the router
// took over from net/http: requests in flight that the server's own
// accounting no longer sees. A graceful shutdown waits for them too.
func (rt *Router) Detached() int { return rt.taken.Len() }

// WaitDetached waits until no stream runs on a taken-over connection, or
// ctx ends (false).
func (rt *Router) WaitDetached(ctx context.Context) bool { return rt.taken.Wait(ctx) }

// CloseDetached cuts the streams on taken-over connections: their clients'
// connections close, which cancels each request as a client leaving does.
func (rt *Router) CloseDetached() { rt.taken.CutAll() }

// Watcher returns the router's watcher of taken-over connections (and of
// the front's: Listener.Front takes it), started on the first call; nil
// where there is none (not Linux, or it could not start): streams then
// stay on net/http's goroutine, and do not run beside it.
func (rt *Router) Watcher() *httpwire.Watcher {
	rt.watchOnce.Do(func() {
		w, err := httpwire.NewWatcher()
		if err != nil {
			rt.log.Info().Err(err).Msg("slow streams stay on net/http's connections")
			return
		}
		rt.watcher = w
	})
	return rt.watcher
}

// hop is what the dispatch of a stream, running on a goroutine of its own,
// tells the handler that waits for it.
type hop uint8

const (
	hopDone  hop = iota // answered on net/http's connection: return
	hopAbort            // the answer must be cut: panic(http.ErrAbortHandler)
	hopTaken            // the connection is the router's now: return at once
)

// serveOnOwnGoroutine runs a stream's dispatch on a goroutine of its own,
// so that the handler (net/http's connection goroutine) can return if the
// stream is taken over; otherwise the handler waits for it, as if it had
// run the dispatch itself. A panic in the dispatch is the request's alone,
// as net/http makes it for handlers: logged, the answer cut.
func (d *dispatch) serveOnOwnGoroutine(v *view, mv *modelView) {
	d.hop = make(chan hop, 1)
	spareWorkers.run(func() { d.runAndEnd(v, mv) })
	if <-d.hop == hopAbort {
		panic(http.ErrAbortHandler)
	}
}

// runAndEnd is the dispatch goroutine of serveOnOwnGoroutine.
func (d *dispatch) runAndEnd(v *view, mv *modelView) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				d.rt.log.Error().Str(logRequestID, d.rid).Interface("panic", p).Str("stack", string(debug.Stack())).
					Msg("panic serving a request; its answer is cut")
				d.failedInternally()
			}
			d.abort = true
		}
		d.end()
		if d.tk == nil {
			// Still on net/http: end the watch of its context here rather
			// than have the handler's return fire it on a goroutine.
			if d.stopClientWatch() {
				d.clientCancel(context.Canceled)
			}
			if d.abort {
				d.hop <- hopAbort
			} else {
				d.hop <- hopDone
			}
			return
		}
		// Counted as busy until its last bytes are out: a shutdown
		// waiting for it must not exit before the terminator.
		d.tk.End(!d.abort && d.outcome != outcomeClientGone)
		d.rt.taken.Remove(d.tk)
	}()
	d.run(v, mv)
}

// detach gives the request a context of its own, cancelled by the
// returned function, in place of net/http's, which ends with the handler.
// What the client's leaving did to net/http's it does to this one until
// the takeover is complete.
func (d *dispatch) detach() func(error) {
	d.stopClientWatch() // when it already fired, the request is cancelled
	// The hook holds net/http's context and, through it, all the
	// middleware put there (the request's logger, the route's context):
	// a held stream must not keep them.
	d.stopClientWatch = nil
	return d.clientCancel
}

// mayTakeOver reports whether the answer under way can still leave
// net/http: a stream running beside its handler (d.hop: HTTP/1.1, a
// watcher), not taken over nor refused yet, whose committed 2xx answer
// has a body that net/http sends chunked (streams have no Content-Length).
func (d *dispatch) mayTakeOver() bool {
	return d.hop != nil && d.tk == nil && !d.noTakeover &&
		d.committed && d.status >= 200 && d.status < 300 && d.status != http.StatusNoContent
}

// detachable makes the request's context one that outlives the handler
// (cancelled when net/http's is, until detach): for a stream that may be
// taken over. It carries no values: the legs get what they need from the
// dispatch (request ID, spans), and a held stream does not keep the
// middleware's (a logger, the route's context) for its whole life.
func (d *dispatch) detachable() {
	ctx := newDetachedCtx(d.r.Context())
	d.ctx, d.clientCancel, d.stopClientWatch = ctx, ctx.cancel, ctx.unwatch
}

// out writes b to the client: through net/http, flushed when flush is set,
// or as a chunk of a taken-over connection (always at once: a taken-over
// stream is slow).
func (d *dispatch) out(b []byte, flush bool) error {
	if d.tk != nil {
		return d.tk.Write(b)
	}
	if _, err := d.w.Write(b); err != nil {
		return err
	}
	if flush {
		if err := d.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
	}
	return nil
}
