package router

import (
	"context"
	"errors"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Connection takeover. A streamed answer whose decode turns out to be slow
// (a wait for its next bytes passed slowStreamWait: a queued, held or
// slowly generating request, whose stream may stay open for minutes) leaves
// net/http: the dispatch hijacks the client's connection, writes the rest
// of the chunked answer to it itself, and lets the handler return, so that
// net/http's connection goroutine (a 16 KiB stack), its background reader
// and its 10 KiB of buffers are released for the stream's whole life. What
// net/http did for such a stream the takeover keeps doing:
//
//   - a client that closes its connection cancels the request: one
//     goroutine of the router (connWatcher, Linux's epoll) watches every
//     taken-over connection, as net/http's background read did one each;
//   - the answer ends with the chunked terminator (RFC 9112 §7.1), and the
//     connection goes back to the server for the client's next request
//     (keep-alive): the watcher waits for its first bytes, up to the
//     listener's idle timeout, and hands the connection to the server's
//     accept loop (Listener);
//   - the request still counts against --max-inflight and in the router's
//     in-flight gauge, and its span and `request` line end with the stream;
//   - a shutdown waits for it (Router.Detached) and cuts what is left
//     (Router.CloseDetached).
//
// The cost is a goroutine per stream request (the dispatch runs beside the
// handler, which waits for it, so that the handler can return early); a
// stream that generates at speed is never taken over and finishes on
// net/http's connection.

// Listener wraps the server's listener so that a connection the router
// took over can be handed back to the server after its stream: Accept
// returns both new connections and handed-back ones. Serve the router's
// server on it (http.Server.Serve(router.NewListener(ln, idle))); without
// it a taken-over connection is closed at the end of its stream.
type Listener struct {
	net.Listener
	idle time.Duration

	accepted chan acceptResult
	back     chan net.Conn
	closed   chan struct{} // Close was called
	pumpDone chan struct{} // the underlying listener failed for good
	err      error         // its error, set before pumpDone closes
	once     sync.Once

	mu        sync.Mutex
	keepAlive bool
	idleConns map[*takenConn]struct{} // waiting for the client's next request

	// front serves the router's hot requests without net/http (front.go);
	// nil sends every connection to net/http.
	front       atomic.Pointer[frontConfig]
	fronts      map[*frontConn]struct{} // connections the front serves
	frontClosed bool
}

type acceptResult struct {
	c   net.Conn
	err error
}

// NewListener wraps ln. A handed-back connection waits up to idle for the
// client's next request (the server's IdleTimeout; 2 minutes when idle is
// not positive).
func NewListener(ln net.Listener, idle time.Duration) *Listener {
	if idle <= 0 {
		idle = 2 * time.Minute
	}
	l := &Listener{Listener: ln, idle: idle, accepted: make(chan acceptResult), back: make(chan net.Conn),
		closed: make(chan struct{}), pumpDone: make(chan struct{}), keepAlive: true, idleConns: map[*takenConn]struct{}{},
		fronts: map[*frontConn]struct{}{}}
	go l.pump()
	return l
}

// pump accepts from the underlying listener, one connection at a time: it
// waits for the server's next Accept before the next one, so the server's
// own back-off on errors still paces it.
func (l *Listener) pump() {
	for {
		c, err := l.Listener.Accept()
		if c != nil {
			cc := &clientConn{Conn: c, l: l}
			if f := l.front.Load(); f != nil {
				go l.serveFront(cc, f)
				continue
			}
			c = cc
		}
		select {
		case l.accepted <- acceptResult{c, err}:
		case <-l.closed:
			if c != nil {
				_ = c.Close()
			}
			l.err = net.ErrClosed
			close(l.pumpDone)
			return
		}
		if err != nil && !isTemporary(err) {
			l.err = err
			close(l.pumpDone)
			return
		}
	}
}

// isTemporary is the test net/http's accept loop applies to retry.
func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// Accept returns the next new or handed-back connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case a := <-l.accepted:
		return a.c, a.err
	case c := <-l.back:
		return c, nil
	case <-l.pumpDone:
		return nil, l.err
	}
}

// Close closes the listener and every handed-back connection still
// waiting for its client's next request; later ones are closed, not handed
// back.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	l.DisableKeepAlives()
	l.mu.Lock()
	l.frontClosed = true
	waiting := l.frontList()
	l.mu.Unlock()
	// The front's connections waiting for a head, a first one too, are
	// closed: a request arriving from here would meet a closing router.
	for _, fc := range waiting {
		fc.shutIfWaiting(true)
	}
	return l.Listener.Close()
}

// frontList is the front's connections; l.mu is held.
func (l *Listener) frontList() []*frontConn {
	conns := make([]*frontConn, 0, len(l.fronts))
	for fc := range l.fronts {
		conns = append(conns, fc)
	}
	return conns
}

// CloseFront closes every connection the front serves and cancels the
// requests in flight on them: what http.Server.Close does to net/http's.
func (l *Listener) CloseFront() {
	l.mu.Lock()
	l.frontClosed = true
	conns := l.frontList()
	l.mu.Unlock()
	for _, fc := range conns {
		fc.cutRequest()
	}
}

// keepAlives reports whether connections are kept between requests.
func (l *Listener) keepAlives() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keepAlive
}

// DisableKeepAlives makes every taken-over connection close at the end of
// its stream instead of going back to the server, and closes the ones
// waiting for their client's next request: what
// http.Server.SetKeepAlivesEnabled(false) does for the server's own.
func (l *Listener) DisableKeepAlives() {
	l.mu.Lock()
	l.keepAlive = false
	idle := l.idleConns
	l.idleConns = map[*takenConn]struct{}{}
	fronts := l.frontList()
	l.mu.Unlock()
	for _, fc := range fronts {
		fc.shutIfWaiting(false) // idle ones; a new one gets its first answer, with Connection: close
	}
	for tc := range idle {
		tc.mu.Lock()
		tc.state = takenDone
		tc.mu.Unlock()
		tc.close()
	}
}

// park registers tc as waiting for its client's next request; false when
// keep-alives are off.
func (l *Listener) park(tc *takenConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.keepAlive {
		return false
	}
	l.idleConns[tc] = struct{}{}
	return true
}

// unpark takes tc off the waiting list; false when DisableKeepAlives took
// it (and closed its connection) first.
func (l *Listener) unpark(tc *takenConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.idleConns[tc]
	delete(l.idleConns, tc)
	return ok
}

// handBack gives c back for its client's next request: to the front, or
// the server's accept loop.
func (l *Listener) handBack(c *clientConn) {
	if f := l.front.Load(); f != nil {
		l.serveFront(c, f)
		return
	}
	l.toServer(c)
}

// toServer gives c to the server's accept loop, or closes it when the
// listener is closed.
func (l *Listener) toServer(c net.Conn) {
	select {
	case l.back <- c:
	case <-l.closed:
		_ = c.Close()
	case <-l.pumpDone:
		_ = c.Close()
	}
}

// clientConn is a connection the Listener accepted: it knows where to go
// back to. pending holds bytes read ahead of a takeover or of the front's
// hand-over to net/http (the next request's first bytes, pipelined): they
// are read first once the connection is back.
type clientConn struct {
	net.Conn
	l       *Listener
	pending []byte
	rd      readDeadlines
}

// readDeadlines are a clientConn's read deadlines. While the front owns the
// connection they are deferred: a deadline set goes on the socket when a
// read needs it, not at once. The front sets up to five per request (the
// idle wait, the head's timeout and its clearing, BodyDeadline's and its
// clearing), each a timer changed under the poller's lock, and a request
// whose head and body came in one read needs only the first. A deadline set
// while a read is under way (from another goroutine, to cut it short) goes
// on at once, as does every one while net/http or a takeover owns the
// connection.
type readDeadlines struct {
	mu       sync.Mutex
	deferred bool
	reading  int       // reads under way
	known    bool      // applied is the socket's deadline
	want     time.Time // the deadline last set
	applied  time.Time
}

// apply puts the deadline last set on c's socket, if it is not there.
func (d *readDeadlines) apply(c net.Conn) error {
	if d.known && d.applied.Equal(d.want) {
		return nil
	}
	err := c.SetReadDeadline(d.want)
	d.applied, d.known = d.want, err == nil
	return err
}

// deferReadDeadlines defers the connection's read deadlines (the front
// takes it) or stops deferring them, putting the last one set on the
// socket (the front gives it to net/http or a hijacker).
func (c *clientConn) deferReadDeadlines(on bool) {
	c.rd.mu.Lock()
	defer c.rd.mu.Unlock()
	c.rd.deferred = on
	if !on {
		_ = c.rd.apply(c.Conn)
	}
}

func (c *clientConn) SetReadDeadline(t time.Time) error {
	c.rd.mu.Lock()
	defer c.rd.mu.Unlock()
	c.rd.want = t
	if c.rd.deferred && c.rd.reading == 0 {
		return nil
	}
	return c.rd.apply(c.Conn)
}

func (c *clientConn) SetDeadline(t time.Time) error {
	err := c.SetReadDeadline(t)
	if werr := c.Conn.SetWriteDeadline(t); err == nil {
		err = werr
	}
	return err
}

func (c *clientConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	c.rd.mu.Lock()
	if err := c.rd.apply(c.Conn); err != nil {
		c.rd.mu.Unlock()
		return 0, err
	}
	c.rd.reading++
	c.rd.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.rd.mu.Lock()
	c.rd.reading--
	c.rd.mu.Unlock()
	return n, err
}

// unread puts b, read from c ahead of its reader's need (net/http's or the
// front's buffer at a hand-over), back before what pending still holds:
// the connection's next reader gets both, in order.
func (c *clientConn) unread(b []byte) {
	c.pending = append(append(make([]byte, 0, len(b)+len(c.pending)), b...), c.pending...)
}

// CloseWrite lets net/http half-close the connection as it does a TCP one.
func (c *clientConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// takenConn is a client's connection while the router owns it: during its
// stream, and after it while it waits for the client's next request. The
// router's connWatcher watches it for the client's bytes or its leaving,
// without a goroutine of its own.
type takenConn struct {
	c      net.Conn    // as hijacked: a *clientConn when served through a Listener
	w      net.Conn    // where chunks are written: the TCP connection itself, for writev
	cancel func(error) // cancels the request: the client left
	// keep: the client may send another request on the connection, which
	// is then watched for it; false closes the connection after the stream
	// (asked to close, not the Listener's, or the watcher could not take it).
	keep   bool
	hdr    [20]byte    // a chunk's size line
	outArr [3][]byte   // a chunk's size line, data and CRLF, as one writev
	out    net.Buffers // (kept here: a local list would be allocated per chunk)
	cw     *connWatcher
	token  int32 // the watcher's name for it; 0 when not watched

	mu        sync.Mutex
	state     takenState
	readAhead bool      // the client sent its next request during the stream
	gone      bool      // the client closed its side (or it failed)
	idleUntil time.Time // in takenIdle: when the connection is closed
}

type takenState uint8

const (
	takenStreaming takenState = iota
	takenIdle                 // the stream is over; waiting for the next request
	takenDone                 // handed back or closed
)

var (
	errClientClosed = errors.New("the client closed its connection")
	errStreamCut    = errors.New("the router cut the stream: it is shutting down")
	crlf            = []byte("\r\n")
	lastChunk       = []byte("0\r\n\r\n")
)

// takeover takes the client's connection off net/http: see the top of this
// file. It is called only on the dispatch's own goroutine (d.hop set, which
// serve does only once there is a watcher); false leaves the stream on
// net/http (the connection cannot be hijacked).
func (d *dispatch) takeover() bool {
	cw := d.rt.watcher
	// What the relay left in net/http's buffer goes first: Hijack drops it.
	if d.rc.Flush() != nil {
		return false
	}
	c, brw, err := d.rc.Hijack()
	if err != nil {
		return false
	}
	cc, _ := c.(*clientConn)
	// HTTP/1.1 only (serve): keep-alive unless asked to close, and when
	// the connection can go back to the server (its Listener's).
	tc := &takenConn{c: c, w: c, cw: cw, keep: !d.r.Close && cc != nil}
	if cc != nil {
		tc.w = cc.Conn
	}
	if n := brw.Reader.Buffered(); n > 0 {
		// net/http already read the client's next request (pipelined):
		// it goes back with the connection. The client's leaving is still
		// watched for, on the socket, as net/http's background read does;
		// new bytes there end that, as they do in net/http.
		tc.readAhead = true
		if cc != nil {
			b, _ := brw.Reader.Peek(n)
			cc.unread(b)
		}
	}
	// From here the request's context is the router's: net/http cancels
	// its own as soon as the handler returns.
	tc.cancel = d.detach()
	// net/http's request, response and connection (its buffers, the
	// request's headers and body reader) are garbage from here.
	d.tk, d.w, d.rc, d.r = tc, nil, http.ResponseController{}, nil
	d.rt.taken.add(tc)
	d.rt.m.takenOver.Inc()
	d.hop <- hopTaken
	if err := cw.add(tc); err != nil {
		// The stream goes on; the client's leaving is seen at the next
		// write instead, and the connection closes after it.
		tc.keep = false
		d.rt.log.Warn().Err(err).Str(logRequestID, d.rid).Msg("cannot watch a taken-over connection")
	}
	return true
}

// onReadable is the watcher's event: the client sent bytes (data) or left.
// During the stream, bytes are its next request (left in the socket for
// the server, and, as net/http does, the client's leaving is no longer
// watched for) and leaving cancels the request; after it, bytes hand the
// connection back and leaving closes it.
func (tc *takenConn) onReadable(data bool) {
	tc.mu.Lock()
	switch tc.state {
	case takenStreaming:
		if data {
			tc.readAhead = true
		} else {
			tc.gone = true
		}
		tc.mu.Unlock()
		if !data {
			tc.cancel(errClientClosed)
		}
	case takenIdle:
		tc.state = takenDone
		tc.mu.Unlock()
		if data {
			tc.handBack()
		} else {
			tc.close()
		}
	default:
		tc.mu.Unlock()
	}
}

// write sends b to the client as one chunk of the answer.
func (tc *takenConn) write(b []byte) error {
	hdr := strconv.AppendInt(tc.hdr[:0], int64(len(b)), 16)
	hdr = append(hdr, '\r', '\n')
	tc.outArr = [3][]byte{hdr, b, crlf}
	tc.out = tc.outArr[:]
	_, err := tc.out.WriteTo(tc.w)
	tc.outArr, tc.out = [3][]byte{}, nil // b is the relay's buffer, back to its pool
	return err
}

// end finishes the stream: complete (the chunked terminator is sent and
// the connection waits for the client's next request, when it may) or cut
// (the connection is closed, so that the client cannot take the answer
// for complete).
func (tc *takenConn) end(complete bool) {
	if complete {
		if _, err := tc.w.Write(lastChunk); err != nil {
			complete = false
		}
	}
	cc, _ := tc.c.(*clientConn)
	if !complete || !tc.keep || cc == nil || !cc.l.park(tc) {
		tc.close()
		return
	}
	tc.mu.Lock()
	switch {
	case tc.state != takenStreaming:
		// Cut (CloseDetached) or closed with the other parked ones
		// (DisableKeepAlives) since the terminator went out.
		tc.mu.Unlock()
		tc.close()
	case tc.gone:
		tc.state = takenDone
		tc.mu.Unlock()
		tc.close()
	case tc.readAhead:
		tc.state = takenDone
		tc.mu.Unlock()
		tc.handBack()
	default:
		// The watcher takes it from here: the next request's first
		// bytes, the client's leaving, or the idle time's end. One that
		// stopped meanwhile would not: then it is closed here (or by the
		// watcher's own stop, whichever comes first).
		tc.state, tc.idleUntil = takenIdle, time.Now().Add(cc.l.idle)
		tc.mu.Unlock()
		if tc.cw.stopped() {
			tc.closeIfIdle()
		}
	}
}

// closeIfIdle closes the connection if it waits for the client's next
// request (takenIdle), whatever its idle time.
func (tc *takenConn) closeIfIdle() { tc.expire(time.Time{}) }

// expire closes an idle connection whose idle time has passed at now (the
// zero time: at once); it reports whether it did.
func (tc *takenConn) expire(now time.Time) bool {
	tc.mu.Lock()
	if tc.state != takenIdle || !now.IsZero() && now.Before(tc.idleUntil) {
		tc.mu.Unlock()
		return false
	}
	tc.state = takenDone
	tc.mu.Unlock()
	tc.close()
	return true
}

// handBack gives the connection back to the server for the client's next
// request (whose bytes wait in the socket, or in clientConn.pending).
func (tc *takenConn) handBack() {
	tc.cw.remove(tc)
	cc := tc.c.(*clientConn)
	if !cc.l.unpark(tc) {
		_ = tc.c.Close() // keep-alives were turned off meanwhile
		return
	}
	go cc.l.handBack(cc)
}

// close stops watching the connection and closes it.
func (tc *takenConn) close() {
	tc.cw.remove(tc)
	if cc, ok := tc.c.(*clientConn); ok {
		cc.l.unpark(tc)
	}
	_ = tc.c.Close()
}

// takenConns are the router's streams on taken-over connections, for a
// shutdown to wait for and cut.
type takenConns struct {
	mu    sync.Mutex
	conns map[*takenConn]struct{}
}

func (t *takenConns) add(tc *takenConn) {
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[*takenConn]struct{}{}
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
}

func (t *takenConns) remove(tc *takenConn) {
	t.mu.Lock()
	delete(t.conns, tc)
	t.mu.Unlock()
}

// Detached is the number of streams running on connections the router
// took over from net/http: requests in flight that the server's own
// accounting no longer sees. A graceful shutdown waits for them too.
func (rt *Router) Detached() int {
	rt.taken.mu.Lock()
	defer rt.taken.mu.Unlock()
	return len(rt.taken.conns)
}

// CloseDetached cuts the streams on taken-over connections: their clients'
// connections close, which cancels each request as a client leaving does.
func (rt *Router) CloseDetached() {
	rt.taken.mu.Lock()
	defer rt.taken.mu.Unlock()
	for tc := range rt.taken.conns {
		tc.cut()
	}
}

// cut closes the connection of a stream still running and cancels the
// stream. One whose stream has ended is left alone: it may already be
// back with the server, serving the client's next request.
func (tc *takenConn) cut() {
	tc.mu.Lock()
	streaming := tc.state == takenStreaming
	if streaming {
		tc.state = takenDone
	}
	tc.mu.Unlock()
	if streaming {
		tc.close()
		tc.cancel(errStreamCut)
	}
}

// connWatcher returns the router's watcher of taken-over connections,
// started with the first stream; nil where there is none (not Linux, or
// it could not start): streams then stay on net/http's goroutine, and do
// not run beside it.
func (rt *Router) connWatcher() *connWatcher {
	rt.watchOnce.Do(func() {
		w, err := newConnWatcher()
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
		d.tk.end(!d.abort && d.outcome != outcomeClientGone)
		d.rt.taken.remove(d.tk)
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
		return d.tk.write(b)
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
