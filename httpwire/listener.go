package httpwire

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener wraps the server's listener so that a connection the router
// took over can be handed back to the server after its stream: Accept
// returns both new connections and handed-back ones. Serve the router's
// server on it (http.Server.Serve(httpwire.NewListener(ln, idle))); without
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
	idleConns map[*Stream]struct{} // waiting for the client's next request

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
		closed: make(chan struct{}), pumpDone: make(chan struct{}), keepAlive: true, idleConns: map[*Stream]struct{}{},
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
	l.idleConns = map[*Stream]struct{}{}
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
func (l *Listener) park(tc *Stream) bool {
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
func (l *Listener) unpark(tc *Stream) bool {
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
