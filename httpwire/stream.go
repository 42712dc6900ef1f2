package httpwire

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Stream is a client's connection while the router owns it: during its
// stream, and after it while it waits for the client's next request. The
// router's Watcher watches it for the client's bytes or its leaving,
// without a goroutine of its own.
type Stream struct {
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
	cw     *Watcher
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

// onReadable is the watcher's event: the client sent bytes (data) or left.
// During the stream, bytes are its next request (left in the socket for
// the server, and, as net/http does, the client's leaving is no longer
// watched for) and leaving cancels the request; after it, bytes hand the
// connection back and leaving closes it.
func (tc *Stream) onReadable(data bool) {
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

// Write sends b to the client as one chunk of the answer.
func (tc *Stream) Write(b []byte) error {
	hdr := strconv.AppendInt(tc.hdr[:0], int64(len(b)), 16)
	hdr = append(hdr, '\r', '\n')
	tc.outArr = [3][]byte{hdr, b, crlf}
	tc.out = tc.outArr[:]
	_, err := tc.out.WriteTo(tc.w)
	tc.outArr, tc.out = [3][]byte{}, nil // b is the relay's buffer, back to its pool
	return err
}

// End finishes the stream: complete (the chunked terminator is sent and
// the connection waits for the client's next request, when it may) or cut
// (the connection is closed, so that the client cannot take the answer
// for complete).
func (tc *Stream) End(complete bool) {
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
func (tc *Stream) closeIfIdle() { tc.expire(time.Time{}) }

// expire closes an idle connection whose idle time has passed at now (the
// zero time: at once); it reports whether it did.
func (tc *Stream) expire(now time.Time) bool {
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
func (tc *Stream) handBack() {
	tc.cw.remove(tc)
	cc := tc.c.(*clientConn)
	if !cc.l.unpark(tc) {
		_ = tc.c.Close() // keep-alives were turned off meanwhile
		return
	}
	go cc.l.handBack(cc)
}

// close stops watching the connection and closes it.
func (tc *Stream) close() {
	tc.cw.remove(tc)
	if cc, ok := tc.c.(*clientConn); ok {
		cc.l.unpark(tc)
	}
	_ = tc.c.Close()
}

// Streams are the router's streams on taken-over connections, for a
// shutdown to wait for and cut.
type Streams struct {
	mu    sync.Mutex
	conns map[*Stream]struct{}
	count InFlight // len(conns), and when it is 0
}

// Add counts tc.
func (t *Streams) Add(tc *Stream) {
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[*Stream]struct{}{}
	}
	if _, ok := t.conns[tc]; !ok {
		t.conns[tc] = struct{}{}
		t.count.Add(1)
	}
	t.mu.Unlock()
}

// Remove stops counting tc.
func (t *Streams) Remove(tc *Stream) {
	t.mu.Lock()
	if _, ok := t.conns[tc]; ok {
		delete(t.conns, tc)
		t.count.Add(-1)
	}
	t.mu.Unlock()
}

// Wait waits until no stream is counted, or ctx ends (false).
func (t *Streams) Wait(ctx context.Context) bool { return t.count.Wait(ctx) }

// cut closes the connection of a stream still running and cancels the
// stream. One whose stream has ended is left alone: it may already be
// back with the server, serving the client's next request.
func (tc *Stream) cut() {
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

// Len is the number of streams counted: requests in flight that the
// server's own accounting no longer sees.
func (t *Streams) Len() int { return int(t.count.Count()) }

// CutAll cuts every stream still running (their clients' connections
// close, which cancels each request as a client leaving does).
func (t *Streams) CutAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for tc := range t.conns {
		tc.cut()
	}
}

// TakeOver takes the connection of the request r, answered through rc,
// off net/http: what was written is flushed, the connection hijacked, and
// the rest of the answer is the returned Stream's (its chunks, its end).
// The request had to be HTTP/1.1 with a chunked answer under way. Once
// the connection is hijacked, detach is called for the function that
// cancels the request (the client left, or the stream was cut): from here
// the request's context must be the caller's own, as net/http cancels its
// own when the handler returns. Call Watch once the handler may return.
// false: the connection cannot be taken (the answer stays on net/http).
func TakeOver(rc *http.ResponseController, r *http.Request, w *Watcher, detach func() func(error)) (*Stream, bool) {
	// What the relay left in net/http's buffer goes first: Hijack drops it.
	if rc.Flush() != nil {
		return nil, false
	}
	c, brw, err := rc.Hijack()
	if err != nil {
		return nil, false
	}
	cc, _ := c.(*clientConn)
	// Keep-alive unless asked to close, and when the connection can go
	// back to the server (its Listener's).
	tc := &Stream{c: c, w: c, cw: w, keep: !r.Close && cc != nil}
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
	tc.cancel = detach()
	return tc, true
}

// Watch starts watching the client's connection for its leaving (and,
// after the stream, for its next request). On an error the stream goes
// on; the client's leaving is then seen at the next write instead, and
// the connection closes after the stream.
func (tc *Stream) Watch() error {
	err := tc.cw.add(tc)
	if err != nil {
		tc.keep = false
	}
	return err
}
