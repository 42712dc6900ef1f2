package httpwire

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// The front: generation requests read and answered without net/http's
// server, which costs a request more CPU than the rest of pdplane's
// handler chain (router/BENCHMARKS.md). A connection the Listener accepts
// is read here first. A request of the router's hot path — a POST of
// HTTP/1.1 to a generation route, its body sized by one Content-Length, a
// valid Host, no Expect, Upgrade, Transfer-Encoding or query, its head
// within one buffer and ended by CRLF CRLF — or a GET of /v1/models
// without a body, is parsed here and passed to
// the server's whole handler (every middleware, the same rules), with a
// ResponseWriter of the front's own. Anything else goes to net/http with
// the bytes already read, and the connection stays there for good:
// net/http answers it, and every other malformed request, as it always did.
//
// Before either, the front judges every request head it reads whole (the
// first of each connection, and each on a connection it keeps), whatever
// its method, more strictly than net/http, where RFC 9112 leaves a server
// the choice and request smuggling lives (§11.2): it answers 400 and
// closes the connection for a head with both Content-Length and
// Transfer-Encoding (§6.1: a server may reject it, and must close the
// connection after answering it either way; net/http reads it as chunked
// and keeps the connection), with a line folded onto the one before it
// (obs-fold, §5.2: reject with 400 or replace by spaces), or with a bare
// LF or a bare CR (§2.2: a server may take a bare LF as a line's end, and
// must treat a bare CR as invalid or as a space; net/http takes both). A
// head longer than frontBufSize, or one after the connection went to
// net/http, is net/http's alone. What net/http's server does for a request
// the front keeps doing:
//
//   - a client that closes its connection while its request runs cancels
//     the request's context: the router's Watcher (Linux's epoll)
//     watches the connection until the end of the answer, from watchDelay
//     after the end of the body (net/http's background read watches from
//     the end of the body);
//   - a new connection's first request head must come within the server's
//     ReadHeaderTimeout (none when it is 0), a later one within its
//     IdleTimeout and then the ReadHeaderTimeout; a connection whose head
//     does not come whole in time is closed. A head may not exceed
//     frontBufSize (net/http takes up to 1 MiB);
//   - the answer: the header as it was at WriteHeader; a Content-Length for
//     one the handler ends before flushing within one buffer, chunked
//     otherwise (or as the handler's own Transfer-Encoding says); a
//     declared length enforced (ErrContentLength past it, the connection
//     closed when short of it); Date and, when missing, a sniffed
//     Content-Type; "Connection: close" from the client or the handler,
//     with keep-alives off for a shutdown, or with more than maxDiscard of
//     the body unread, closes the connection after the answer; a smaller
//     unread rest is read away;
//   - a handler that panics gets its panic logged and its connection
//     closed; Hijack hands the connection to the router's takeover, which
//     gives it back to the front after the stream;
//   - a shutdown: the Listener's DisableKeepAlives closes the idle
//     connections, Close all that wait for a head, CloseFront every one,
//     its request cut (closed before it is cancelled, so that the answer
//     cannot end as if complete).

// hotPaths are the routes the front serves itself, POSTed; getPaths are
// the ones it serves on a GET without a body: a client that lists the
// models first (as OpenAI's SDKs are often used) keeps its connection on
// the front for the generation requests that follow.
var (
	hotPaths = [...]string{"/v1/chat/completions", "/v1/completions", "/generate"}
	getPaths = [...]string{"/v1/models"}
)

// frontBufSize bounds a head the front reads; a longer one goes to
// net/http. It is also the answer's write buffer.
const frontBufSize = 4096

// maxDiscard is the most unread body the front reads away after an answer
// to keep the connection (net/http's bound).
const maxDiscard = 256 << 10

var (
	frontReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, frontBufSize) }}
	frontWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, frontBufSize) }}
)

// Front makes the listener read connections itself and serve the
// generation requests with h (the server's whole handler), handing the
// rest to net/http; headTimeout is the server's ReadHeaderTimeout. It
// needs a Watcher to see clients leave, and is left off (false) without
// one (nil: where there is none). Call it before Serve.
func (l *Listener) Front(h http.Handler, headTimeout time.Duration, cw *Watcher) bool {
	if cw == nil {
		return false
	}
	l.front.Store(&frontConfig{h: h, headTimeout: headTimeout, cw: cw})
	return true
}

// frontConfig is what Front was given.
type frontConfig struct {
	h           http.Handler
	headTimeout time.Duration
	cw          *Watcher
}

// frontConn is one client connection while the front serves it.
type frontConn struct {
	l          *Listener
	f          *frontConfig
	c          *clientConn
	br         *bufio.Reader
	bw         *bufio.Writer
	remoteAddr string
	hijacked   bool
	mu         sync.Mutex
	busy       bool                    // serving a request (from its head to its answer's end)
	served     bool                    // it served one: waiting now is idle, not new
	shut       bool                    // closed by the listener while waiting for a head
	cut        bool                    // closed by CloseFront: the answer must not end as if complete
	cancel     context.CancelCauseFunc // the request's (the last one's) context

	// The timer that starts a request's watch (frontBody.watch), one per
	// connection, and the request it runs for.
	wmu        sync.Mutex
	watchTimer *time.Timer
	watchBody  *frontBody
	watchAt    time.Time
}

// serveFront reads requests from c until one is not the front's, the
// client leaves, or the connection fails or closes.
func (l *Listener) serveFront(c *clientConn, f *frontConfig) {
	fc := &frontConn{l: l, f: f, c: c, br: frontReaders.Get().(*bufio.Reader), remoteAddr: c.RemoteAddr().String()}
	fc.br.Reset(c)
	defer fc.release()
	// A fault of the front's own (outside the handler, which run guards)
	// ends this connection only, as net/http's per-connection recover
	// does: never the process, with every other client's request.
	defer func() {
		if p := recover(); p != nil {
			log.Printf("http: panic serving %s: %v\n%s", fc.remoteAddr, p, debug.Stack())
			if !fc.hijacked {
				_ = c.Close()
			}
		}
	}()
	if !l.trackFront(fc) {
		_ = c.Close()
		return
	}
	defer l.untrackFront(fc)
	c.deferReadDeadlines(true) // until toNetHTTP or Hijack
	first := true
	for {
		q, n, verdict := fc.nextRequest(first)
		switch verdict {
		case headGone:
			_ = c.Close()
			return
		case headRefused:
			return // refuse closed it
		case headNotOurs:
			fc.toNetHTTP()
			return
		}
		if !fc.setBusy(true) {
			_ = c.Close()
			return
		}
		_, _ = fc.br.Discard(n)
		first = false
		if !fc.serve(q) {
			return
		}
	}
}

// release returns the buffers the connection still owns.
func (fc *frontConn) release() {
	if fc.br != nil {
		fc.br.Reset(nil)
		frontReaders.Put(fc.br)
		fc.br = nil
	}
	if fc.bw != nil {
		fc.bw.Reset(nil)
		frontWriters.Put(fc.bw)
		fc.bw = nil
	}
}

// trackFront and untrackFront keep the listener's set of front
// connections, for DisableKeepAlives and CloseFront; false: the listener
// is closed.
func (l *Listener) trackFront(fc *frontConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.frontClosed {
		return false
	}
	l.fronts[fc] = struct{}{}
	return true
}

func (l *Listener) untrackFront(fc *frontConn) {
	l.mu.Lock()
	delete(l.fronts, fc)
	l.mu.Unlock()
}

// setBusy marks fc as serving a request (true) or, after one, waiting for
// the next (false); false when the connection must close instead: the
// listener closed it or is closed (a new request), or keep-alives are off
// (waiting).
func (fc *frontConn) setBusy(busy bool) bool {
	fc.l.mu.Lock()
	defer fc.l.mu.Unlock()
	if busy && fc.l.frontClosed || !busy && !fc.l.keepAlive {
		return false
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.busy = busy
	if !busy {
		fc.served = true
	}
	return !fc.shut
}

// shutIfWaiting closes fc if it is waiting for a head: after a request
// (idle), or also for its first (new).
func (fc *frontConn) shutIfWaiting(alsoNew bool) {
	fc.mu.Lock()
	if fc.busy || !fc.served && !alsoNew {
		fc.mu.Unlock()
		return
	}
	fc.shut = true
	fc.mu.Unlock()
	_ = fc.c.Close()
}

// cutRequest closes fc, then cancels its request, which must not end as
// if complete (CloseFront).
func (fc *frontConn) cutRequest() {
	fc.mu.Lock()
	fc.cut = true
	cancel := fc.cancel
	fc.mu.Unlock()
	_ = fc.c.Close()
	if cancel != nil {
		cancel(errStreamCut)
	}
}

func (fc *frontConn) wasCut() bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.cut
}

type headVerdict uint8

const (
	headOurs    headVerdict = iota // a request the front serves
	headNotOurs                    // net/http's: hand the connection over
	headGone                       // nothing came: closed, failed, timed out or shut down
	headRefused                    // refused (refuseHead): answered 400 and closed
)

// nextRequest waits for the next request's head and parses it if it is
// the front's; n is its length, left in the buffer.
func (fc *frontConn) nextRequest(first bool) (q frontRequest, n int, v headVerdict) {
	c, l := fc.c, fc.l
	if !first {
		if !fc.setBusy(false) {
			return q, 0, headGone
		}
		_ = c.SetReadDeadline(time.Now().Add(l.idle))
		if _, err := fc.br.Peek(1); err != nil {
			return q, 0, headGone
		}
	}
	if fc.f.headTimeout > 0 { // as net/http: none without one
		_ = c.SetReadDeadline(time.Now().Add(fc.f.headTimeout))
	} else {
		_ = c.SetReadDeadline(time.Time{})
	}
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for {
		b, _ := fc.br.Peek(fc.br.Buffered())
		if len(b) > 0 && (b[0] < 'A' || b[0] > 'Z') {
			return q, 0, headNotOurs // no request line of a method (TLS, a leading CRLF): net/http's
		}
		if end := headEnd(b); end > 0 {
			if why := refuseHead(b[:end]); why != "" {
				fc.refuse(why)
				return q, 0, headRefused
			}
			if !mayBeFrontMethod(b) || !bytes.HasSuffix(b[:end], []byte("\r\n\r\n")) {
				return q, 0, headNotOurs
			}
			q, ok := parseFrontRequest(b[:end])
			if !ok {
				return q, 0, headNotOurs
			}
			return q, end, headOurs
		}
		if len(b) == frontBufSize {
			return q, 0, headNotOurs
		}
		if _, err := fc.br.Peek(len(b) + 1); err != nil {
			// Nothing, or part of a head, then the end or the head
			// timeout: closed, as net/http closes such a connection
			// (handing it over would give a slow head a second timeout).
			return q, 0, headGone
		}
	}
}

// headEnd is the length of the head at the start of b, through the empty
// line that ends it (CRLF, or a bare LF: refuseHead judges it), or 0 when
// b holds no whole head yet.
func headEnd(b []byte) int {
	for i := bytes.IndexByte(b, '\n'); i >= 0 && i+1 < len(b); {
		switch {
		case b[i+1] == '\n':
			return i + 2
		case b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n':
			return i + 3
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return 0
}

// refuseHead says why a whole request head is refused with 400 and the
// connection closed (see the comment at the top), or "" when it is not.
func refuseHead(head []byte) string {
	for i, c := range head {
		switch {
		case c == '\n' && (i == 0 || head[i-1] != '\r'):
			return "a line ends in a bare LF (RFC 9112 §2.2)"
		case c == '\r' && (i+1 == len(head) || head[i+1] != '\n'):
			return "a bare CR (RFC 9112 §2.2)"
		}
	}
	var length, chunked bool
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n")) // without the final CRLF CRLF
	for _, line := range lines[1:] {
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			return "a field line is folded onto the one before it (obs-fold, RFC 9112 §5.2)"
		}
		name, _, _ := bytes.Cut(line, []byte(":"))
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length = true
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = true
		}
	}
	if length && chunked {
		return "both Content-Length and Transfer-Encoding (RFC 9112 §6.1, §6.3)"
	}
	return ""
}

// badRequestHead is the head of the front's own 400, as net/http words
// its own.
const badRequestHead = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n" +
	"Connection: close\r\nContent-Length: "

// refuse answers 400 Bad Request saying why, and closes the connection,
// letting the client read the answer before the rest of what it sent is
// thrown away.
func (fc *frontConn) refuse(why string) {
	body := "400 Bad Request: " + why
	_ = fc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(fc.c, badRequestHead+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	fc.closeLingering()
}

// mayBeFrontMethod reports whether a head beginning with b may be a
// request the front serves (b may be shorter than its method).
func mayBeFrontMethod(b []byte) bool {
	for _, m := range [...]string{"POST ", "GET "} {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// toNetHTTP gives the connection, with what was read of it, to net/http.
func (fc *frontConn) toNetHTTP() {
	if n := fc.br.Buffered(); n > 0 {
		b, _ := fc.br.Peek(n)
		fc.c.unread(b)
	}
	_ = fc.c.SetReadDeadline(time.Time{})
	fc.c.deferReadDeadlines(false)
	fc.l.untrackFront(fc)
	fc.l.toServer(fc.c)
}

// frontRequest is a request head the front accepted.
type frontRequest struct {
	method string
	path   string
	header http.Header
	length int64
	host   string
	close  bool
}

// parseFrontRequest parses head if it is the front's to serve. The head
// is copied once; the header's values are pieces of that copy. Fields are
// checked as net/http checks a request's (RFC 9110 §5.1, §5.5); a request
// that would need more judgment than that (folded lines, a second
// Content-Length or Host, anything in Connection but close or keep-alive)
// is left to net/http.
func parseFrontRequest(head []byte) (frontRequest, bool) {
	var q frontRequest
	line, rest := nextLine(string(head))
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" {
		return q, false
	}
	switch method {
	case http.MethodPost:
		for _, p := range hotPaths {
			if target == p {
				q.path = p
			}
		}
	case http.MethodGet:
		for _, p := range getPaths {
			if target == p {
				q.path = p
			}
		}
	}
	if q.path == "" {
		return q, false
	}
	q.method = method
	q.header = make(http.Header, 8)
	q.length = -1
	vals := make([]string, min(strings.Count(rest, "\n"), maxFieldsHint))
	for {
		var field string
		field, rest = nextLine(rest)
		if field == "" {
			break
		}
		name, value, ok := strings.Cut(field, ":")
		if !ok || name == "" || !validFieldName(name) {
			return q, false
		}
		value = strings.Trim(value, " \t")
		for i := 0; i < len(value); i++ {
			if !validFieldValueByte(value[i]) {
				return q, false
			}
		}
		key := textproto.CanonicalMIMEHeaderKey(name)
		switch key {
		case "Content-Length":
			if q.length >= 0 || value == "" || value[0] < '0' || value[0] > '9' {
				return q, false
			}
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return q, false
			}
			q.length = n
		case "Transfer-Encoding", "Expect", "Upgrade", "Te", "Trailer":
			return q, false
		case "Host": // net/http moves it to Request.Host
			if q.host != "" || value == "" || !httpguts.ValidHostHeader(value) {
				return q, false
			}
			q.host = value
			continue
		case "Connection":
			switch strings.ToLower(value) {
			case "close":
				q.close = true
			case "keep-alive":
			default:
				return q, false
			}
		}
		addField(q.header, &vals, key, value)
	}
	if rest != "" {
		return q, false // a blank line ended the head before its CRLF CRLF: net/http's to judge
	}
	if q.host == "" {
		return q, false
	}
	switch {
	case q.method == http.MethodGet && q.length < 0:
		q.length = 0 // no body (RFC 9112 §6.3); a GET with a length is net/http's
	case q.method == http.MethodGet, q.length < 0:
		return q, false
	}
	return q, true
}

// serve runs one request through the handler; false: the connection is
// no longer the front's (closed or hijacked).
func (fc *frontConn) serve(q frontRequest) bool {
	ctx := newRequestCtx()
	cancel := context.CancelCauseFunc(ctx.cancel)
	defer cancel(nil)
	fc.mu.Lock()
	fc.cancel = cancel
	fc.mu.Unlock()
	body := &frontBody{fc: fc, left: q.length, cancel: cancel}
	r := &http.Request{Method: q.method, URL: &url.URL{Path: q.path}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: q.header, Body: body, ContentLength: q.length, Host: q.host, RemoteAddr: fc.remoteAddr, RequestURI: q.path, Close: q.close}
	if q.length == 0 {
		r.Body = http.NoBody // as net/http's
	}
	r = r.WithContext(ctx)
	if fc.bw == nil {
		fc.bw = frontWriters.Get().(*bufio.Writer)
		fc.bw.Reset(fc.c)
	}
	w := &frontWriter{fc: fc, body: body, h: make(http.Header, 4), close: q.close} // sendHead adds keep-alives off
	if q.length == 0 {
		body.watch()
	}
	ok := fc.run(w, r)
	body.unwatch()
	if fc.hijacked {
		fc.br, fc.bw = nil, nil // the hijacker owns them now
		return false
	}
	if fc.wasCut() {
		return false // closed: no terminator may make the answer look whole
	}
	if ok {
		ok = w.finish() == nil && !w.short()
	}
	if ok && body.left > 0 && !w.close {
		// The handler left part of the body: read it away, as net/http
		// does (an answer sent with more than maxDiscard left says
		// Connection: close).
		_, err := io.CopyN(io.Discard, fc.br, body.left)
		ok = err == nil
	}
	if !ok || w.close {
		if body.left > 0 {
			fc.closeLingering()
		} else {
			_ = fc.c.Close()
		}
		return false
	}
	return true
}

// closeLingering closes a connection whose client may still be sending
// the body the handler left: its write side first, the rest a moment
// later, so that the unread bytes do not make the kernel reset the
// connection before the client has read the answer (net/http's
// closeWriteAndWait, without holding a goroutine).
func (fc *frontConn) closeLingering() {
	if cw, ok := fc.c.Conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		c := fc.c
		time.AfterFunc(500*time.Millisecond, func() { _ = c.Close() })
		return
	}
	_ = fc.c.Close()
}

// run calls the handler; false when it panicked (the connection is then
// closed, as net/http does).
func (fc *frontConn) run(w *frontWriter, r *http.Request) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				log.Printf("http: panic serving %s: %v\n%s", fc.remoteAddr, p, debug.Stack())
			}
			ok = false
		}
	}()
	fc.f.h.ServeHTTP(w, r)
	return true
}

// frontBody is a request's body: exactly Content-Length bytes. Once it is
// read to its end, and the request still runs watchDelay later, the
// connection is watched for the client leaving (see the top of the file).
type frontBody struct {
	fc     *frontConn
	left   int64
	cancel context.CancelCauseFunc
	closed bool

	mu      sync.Mutex
	armed   bool    // the connection's watch timer runs for it
	watched *Stream // the Watcher's entry
	over    bool    // the request ended or was hijacked: no watch from here
}

// watchDelay is how long a request runs, its body read, before its
// connection is watched for the client leaving. A watch costs two epoll_ctl
// calls and the watcher's bookkeeping (BenchmarkServerSide: as much as all
// the front saves against net/http's server); a request shorter than this
// is nearly done when its client goes, and a long one (a generation of
// seconds, where cancelling saves the engines' work) is cancelled at most
// this late. net/http watches every request from its body's end.
const watchDelay = 250 * time.Millisecond

func (b *frontBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.fc.br.Read(p)
	b.left -= int64(n)
	switch {
	case b.left == 0:
		b.watch()
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// Close makes later reads fail, as net/http's body does; the rest is
// read away (or the connection closed) after the answer.
func (b *frontBody) Close() error {
	b.closed = true
	return nil
}

// watch starts the watch watchDelay from now.
func (b *frontBody) watch() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.armed && !b.over {
		b.armed = true
		b.fc.armWatch(b)
	}
}

// armWatch has the connection's watch timer (made once, not once per
// request) start b's watch watchDelay from now.
func (fc *frontConn) armWatch(b *frontBody) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.watchBody, fc.watchAt = b, time.Now().Add(watchDelay) // before the timer's own start: never after its firing
	if fc.watchTimer == nil {
		fc.watchTimer = time.AfterFunc(watchDelay, fc.fireWatch)
	} else {
		fc.watchTimer.Reset(watchDelay)
	}
}

// fireWatch is the watch timer's: it starts the watch of the request it
// was armed for, unless that one ended meanwhile or this is the late run
// of a timer armed before (a Reset timer's earlier run may still come).
func (fc *frontConn) fireWatch() {
	fc.wmu.Lock()
	b, early := fc.watchBody, time.Now().Before(fc.watchAt)
	fc.wmu.Unlock()
	if b != nil && !early {
		b.startWatch()
	}
}

// disarmWatch stops the watch timer if it runs for b.
func (fc *frontConn) disarmWatch(b *frontBody) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	if fc.watchBody == b {
		fc.watchBody = nil
		fc.watchTimer.Stop()
	}
}

func (b *frontBody) startWatch() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over || b.watched != nil {
		return
	}
	tc := &Stream{c: b.fc.c, w: b.fc.c.Conn, cw: b.fc.f.cw, cancel: b.cancel, state: takenStreaming}
	if b.fc.f.cw.add(tc) == nil {
		b.watched = tc
	}
}

// unwatch ends the watch, or its wait: before the connection is read
// again, hijacked or closed.
func (b *frontBody) unwatch() {
	b.mu.Lock()
	b.over = true
	if b.armed {
		b.fc.disarmWatch(b)
	}
	tc := b.watched
	b.watched = nil
	b.mu.Unlock()
	if tc != nil {
		b.fc.f.cw.remove(tc)
	}
}

// frontWriter is the front's http.ResponseWriter.
type frontWriter struct {
	fc          *frontConn
	body        *frontBody
	h           http.Header // the handler's
	sent        sentHeader  // what goes out: h as it was at WriteHeader
	status      int
	wroteHeader bool // WriteHeader called
	sentHead    bool // the head is in fc.bw
	chunked     bool
	close       bool
	declared    int64  // the handler's Content-Length, -1 for none
	written     int64  // body bytes written
	pending     []byte // body written before the head went out
}

func (w *frontWriter) Header() http.Header { return w.h }

// WriteHeader fixes the status and, as net/http does, the header: later
// changes to the handler's map are not sent.
func (w *frontWriter) WriteHeader(code int) {
	if w.wroteHeader || w.fc.hijacked {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 {
		return // informational answers are not sent
	}
	w.wroteHeader = true
	w.status = code
	w.declared = w.sent.fix(w.h, code)
}

// sentHeader is the handler's header as it was at WriteHeader, where
// net/http fixes it too: its fields written out (keys sorted, invalid names
// dropped, line breaks in values made spaces, as http.Header.Write does),
// less the framing fields sendHead decides from it (Content-Length,
// Transfer-Encoding, Connection), and whether it set the fields sendHead
// adds when absent.
type sentHeader struct {
	fields   *[]byte
	te, conn []string // its Transfer-Encoding and Connection values
	// Whether it had these fields, which sendHead adds when absent (a
	// Content-Length even invalid, as in net/http, where it stops the
	// length being set).
	hasType, hasDate, hasEncoding, hasLength bool
}

// maxPooledHead is the largest head buffer kept for the next answer: one
// grown past it for a huge header is left to the collector.
const maxPooledHead = 16 << 10

// sentHeaderBufs hold sentHeader fields from WriteHeader to the head's
// sending.
var sentHeaderBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// fix takes h's fields for an answer of status code and returns its
// Content-Length, -1 when it has none or an invalid one (dropped, as
// net/http drops it). A 304 sends no Content-Type, as net/http's.
func (s *sentHeader) fix(h http.Header, code int) (declared int64) {
	declared = -1
	var arr [16]string
	keys := arr[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s.fields = sentHeaderBufs.Get().(*[]byte)
	b := (*s.fields)[:0]
	for _, k := range keys {
		vs := h[k]
		switch k {
		case "Content-Length":
			s.hasLength = true
			if len(vs) > 0 {
				if n, err := strconv.ParseInt(vs[0], 10, 64); err == nil && n >= 0 {
					declared = n
				}
			}
			continue
		case "Transfer-Encoding":
			s.te = slices.Clone(vs)
			continue
		case "Connection":
			s.conn = slices.Clone(vs)
			continue
		case "Content-Type": // present, even empty: nothing is sniffed (as in net/http)
			s.hasType = true
			if code == http.StatusNotModified {
				continue
			}
		case "Date":
			s.hasDate = true
		case "Content-Encoding":
			s.hasEncoding = len(vs) > 0 && vs[0] != ""
		}
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vs {
			b = appendField(b, k, v)
		}
	}
	*s.fields = b
	return declared
}

// appendField appends one header line, its value as http.Header.Write
// writes it.
func appendField(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	if strings.ContainsAny(v, "\r\n") {
		v = strings.Map(func(r rune) rune {
			if r == '\r' || r == '\n' {
				return ' '
			}
			return r
		}, v)
	}
	b = append(b, textproto.TrimString(v)...)
	return append(b, "\r\n"...)
}

func firstValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

func (w *frontWriter) Write(p []byte) (int, error) {
	if w.fc.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.declared >= 0 && w.written+int64(len(p)) > w.declared {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.sentHead {
		// Held back while the answer's length may still be measured: not
		// when the handler declared it (the router's unary answers), which
		// would only copy the body once more.
		if w.declared < 0 && len(w.pending)+len(p) <= frontBufSize {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.sendHead(-1, p)
	}
	return len(p), w.writeBody(p)
}

// short reports whether the answer came short of its declared length:
// the connection must close, or the client would read the next answer as
// the rest of this one.
func (w *frontWriter) short() bool {
	return w.declared >= 0 && w.written < w.declared && bodyAllowed(w.status)
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// sendHead puts the status line and fields in the buffer, with length as
// Content-Length when it is known (>= 0) and the handler set none; a
// missing Content-Type is sniffed from the body's first bytes (those
// pending, else next).
func (w *frontWriter) sendHead(length int, next []byte) {
	w.sentHead = true
	hd, bw := &w.sent, w.fc.bw
	first := w.pending
	if len(first) == 0 {
		first = next
	}
	b := append(*hd.fields, "HTTP/1.1 "...) // the fields go after the status line: b is built past them
	fields := len(*hd.fields)
	b = strconv.AppendInt(b, int64(w.status), 10)
	b = append(b, ' ')
	if text := http.StatusText(w.status); text != "" {
		b = append(b, text...)
	} else { // as net/http's
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(w.status), 10)
	}
	b = append(b, "\r\n"...)
	_, _ = bw.Write(b[fields:])
	_, _ = bw.Write(b[:fields])
	b = b[:0]
	if !hd.hasType && bodyAllowed(w.status) && len(first) > 0 && !hd.hasEncoding && firstValue(hd.te) == "" {
		b = appendField(b, "Content-Type", http.DetectContentType(first))
	}
	if !hd.hasDate {
		b = append(b, "Date: "...)
		b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
		b = append(b, "\r\n"...)
	}
	declared := w.declared
	switch te := firstValue(hd.te); {
	case !bodyAllowed(w.status):
		// Neither framing field, as net/http's (suppressedHeaders).
		declared, w.declared = -1, -1
	case te == "chunked": // the handler's own choice: chunked, no length
		w.chunked = true
		declared, w.declared = -1, -1
		for _, v := range hd.te {
			b = appendField(b, "Transfer-Encoding", v)
		}
	case te != "":
		// Any other coding: the body goes as it is, ended by the close.
		declared, w.declared, w.close = -1, -1, true
	case declared >= 0:
	case length >= 0 && !hd.hasLength:
		declared = int64(length)
	default:
		w.chunked = true
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if declared >= 0 {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, declared, 10)
		b = append(b, "\r\n"...)
	}
	if strings.EqualFold(firstValue(hd.conn), "close") || !w.fc.l.keepAlives() || w.body.left > maxDiscard {
		w.close = true // (a body this large left unread is not read away)
	}
	if w.close {
		b = append(b, "Connection: close\r\n"...)
	} else {
		for _, v := range hd.conn {
			b = appendField(b, "Connection", v)
		}
	}
	b = append(b, "\r\n"...)
	_, _ = bw.Write(b)
	if cap(b) <= maxPooledHead { // one huge header does not stay pooled
		*hd.fields = b[:0]
		sentHeaderBufs.Put(hd.fields)
	}
	hd.fields = nil
	if len(w.pending) > 0 {
		p := w.pending
		w.pending = nil
		_ = w.writeBody(p)
	}
}

func (w *frontWriter) writeBody(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	bw := w.fc.bw
	if w.chunked {
		var size [20]byte
		_, _ = bw.Write(append(strconv.AppendInt(size[:0], int64(len(p)), 16), '\r', '\n'))
		_, _ = bw.Write(p)
		_, err := bw.WriteString("\r\n")
		return err
	}
	_, err := bw.Write(p)
	return err
}

// Flush sends what was written.
func (w *frontWriter) Flush() { _ = w.FlushError() }

func (w *frontWriter) FlushError() error {
	if w.fc.hijacked {
		return http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sentHead {
		w.sendHead(-1, nil)
	}
	return w.fc.bw.Flush()
}

// finish ends the answer after the handler returned.
func (w *frontWriter) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sentHead {
		w.sendHead(len(w.pending), nil)
	}
	if w.chunked {
		_, _ = w.fc.bw.WriteString("0\r\n\r\n")
	}
	return w.fc.bw.Flush()
}

// Hijack gives the connection to the caller, as net/http's does: what was
// written goes out first, the deadlines are cleared, and its buffered
// reader holds what the client sent ahead.
func (w *frontWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.fc.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.wroteHeader && !w.sentHead {
		w.sendHead(-1, nil)
	}
	if err := w.fc.bw.Flush(); err != nil {
		return nil, nil, err
	}
	w.body.unwatch() // the takeover watches it itself
	w.fc.hijacked = true
	w.fc.l.untrackFront(w.fc)
	w.fc.c.deferReadDeadlines(false)
	_ = w.fc.c.SetDeadline(time.Time{})
	return w.fc.c, bufio.NewReadWriter(w.fc.br, w.fc.bw), nil
}

// SetReadDeadline and SetWriteDeadline serve http.ResponseController, as
// net/http's do.
func (w *frontWriter) SetReadDeadline(t time.Time) error  { return w.fc.c.SetReadDeadline(t) }
func (w *frontWriter) SetWriteDeadline(t time.Time) error { return w.fc.c.SetWriteDeadline(t) }
