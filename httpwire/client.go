package httpwire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Transport is the router's HTTP/1.1 client for engine legs. Unlike
// net/http.Transport it keeps no goroutines per connection: a request is
// written (head and body in one writev) and its answer read on the caller's
// goroutine, and an idle connection is a socket and a read buffer. An open
// stream therefore costs the router about half the memory, and a request
// fewer goroutine wake-ups. It speaks plain http:// only; anything else goes
// to the fallback transport.
//
// Idle connections are dropped after idleTimeout, which is shorter than the
// 5 s keep-alive of uvicorn, the server of SGLang and vLLM, and checked
// before reuse once idle for peekAfter (a non-blocking peek sees an engine
// that closed them). One put back more recently is taken without the
// peek's system call: under load that is nearly every reuse, two per P/D
// request. A request that finds its reused connection closed before any
// byte of an answer (an engine that restarted meanwhile, or closed it in
// the moment it was taken) is sent again once on a new connection.
//
// Answers are parsed here (readResponse), to RFC 9112, strictly: framing
// the client cannot be sure of fails the request and closes the connection.
// By design it does not support: HTTPS, proxies, HTTP/2 or an upgrade
// (101 is an error), request pipelining, transfer codings other than
// chunked alone, or keep-alive on HTTP/1.0 (such a connection is not
// reused). Heads, interim ones and trailers included, are bounded by
// maxHead; chunk lines by the read buffer.
type Transport struct {
	dialer      net.Dialer
	maxIdle     int           // idle connections kept per host
	idleTimeout time.Duration // idle connections older than this are closed
	peekAfter   time.Duration // idle connections older than this are peeked at before reuse
	readBuf     int
	maxHead     int64 // bytes of an answer's heads and of its trailers
	fallback    *http.Transport
	readers     sync.Pool // *bufio.Reader of readBuf bytes, lent to connections (see awaitBytes)
	afterWrite  func()    // tests' hook, given to each new connection (upConn.afterWrite)

	mu   sync.Mutex
	idle map[string][]*upConn
}

// upConn is one connection to an engine.
type upConn struct {
	addr   string // host:port as dialled, the idle pool's key
	c      net.Conn
	br     *bufio.Reader // reads c through Read, which applies limit; nil only within awaitBytes
	limit  int64         // bytes c may still deliver to br
	idleAt time.Time
	reused bool

	// raw is c's descriptor, to wait for bytes without a buffer (nil when
	// c has none).
	raw syscall.RawConn

	// Made once per connection rather than once per request: the hook
	// that closes it when a request's context ends, and the request's
	// head and body as one writev.
	closeConn   func()
	writeInWait func(uintptr) bool // writeRequest's callback
	outArr      [2][]byte
	out         net.Buffers
	wrote       bool   // writeRequest's state
	writeErr    error  // (on the connection: a closure per request would be allocated)
	afterWrite  func() // tests': between the write and the wait (Transport.afterWrite)
	// The reader of the answer being read, one of the two (see framing);
	// an answer's upBody stops using it at its end, before the connection
	// can carry another.
	fixed   fixedBody
	chunked chunkedBody
}

// Read is br's source: while a head is read limit bounds it, so that an
// endless head fails instead of filling memory.
func (uc *upConn) Read(p []byte) (int, error) {
	if uc.limit <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > uc.limit {
		p = p[:uc.limit]
	}
	n, err := uc.c.Read(p)
	uc.limit -= int64(n)
	return n, err
}

var errHeadTooLarge = errors.New("upstream answer: head or trailers too large")

// nothingReceivedError is a connection that ended before any byte of an
// answer: on a reused connection, an engine that closed it as idle.
type nothingReceivedError struct{ err error }

func (e *nothingReceivedError) Error() string {
	return "upstream connection ended before any byte of an answer: " + e.err.Error()
}

// Unwrap never yields io.EOF: callers take that for a body's clean end.
func (e *nothingReceivedError) Unwrap() error {
	if e.err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return e.err
}

// TransportConfig configures a Transport.
type TransportConfig struct {
	// ConnectTimeout bounds a dial; none when zero.
	ConnectTimeout time.Duration
	// MaxIdleConnsPerHost is how many idle connections are kept per engine.
	MaxIdleConnsPerHost int
}

// NewTransport returns a Transport; answers from https:// engines go
// through a tuned net/http transport of the same settings.
func NewTransport(cfg TransportConfig) *Transport {
	t := &Transport{
		dialer:      net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second},
		maxIdle:     cfg.MaxIdleConnsPerHost,
		idleTimeout: 4 * time.Second,
		peekAfter:   time.Second,
		readBuf:     2 << 10,
		maxHead:     1 << 20, // as net/http.DefaultMaxHeaderBytes
		fallback:    newTransport(cfg),
		idle:        map[string][]*upConn{},
	}
	t.readers.New = func() any { return bufio.NewReaderSize(nil, t.readBuf) }
	return t
}

// requestBody is a request body the transport can write without copying.
type requestBody struct {
	bytes.Reader
	b []byte
}

func (*requestBody) Close() error { return nil }

func NewRequestBody(b []byte) *requestBody {
	ub := &requestBody{b: b}
	ub.Reset(b)
	return ub
}

// RoundTrip sends one request and returns the answer, whose body must be
// read to the end or closed (on the caller's goroutine).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	var body []byte
	if ub, ok := req.Body.(*requestBody); ok {
		body = ub.b
	} else if req.Body != nil && req.Body != http.NoBody {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			req.Body.Close()
			return nil, err
		}
	}
	if req.Body != nil {
		req.Body.Close()
	}
	hb := HeadBuf()
	head := AppendRequestHead(*hb, req, len(body))
	defer PutHeadBuf(hb, head)
	return t.send(ctx, DialAddr(req.URL), head, body, req)
}

// Post sends a POST whose head the caller wrote (with its Host and
// Content-Length, as AppendRequestHead writes them) to addr, host:port:
// the router's own legs, without an http.Request to build and take apart
// again. Its answer's Request is nil.
func (t *Transport) Post(ctx context.Context, addr string, head, body []byte) (*http.Response, error) {
	return t.send(ctx, addr, head, body, nil)
}

// send is RoundTrip's and Post's: req, when not nil, is the request
// head was written from (its method and Close are heeded, and it is the
// answer's Request); nil is a POST.
func (t *Transport) send(ctx context.Context, addr string, head, body []byte, req *http.Request) (*http.Response, error) {
	for try := 0; ; try++ {
		uc, err := t.get(ctx, addr, try == 0)
		if err != nil {
			return nil, withCtxErr(ctx, err)
		}
		resp, err := t.exchange(ctx, uc, req, head, body)
		if err == nil {
			return resp, nil
		}
		uc.c.Close()
		// An engine that closed an idle connection as it was taken: send
		// again, once, on a connection dialled for it (RFC 9112 §9.3.1): another
		// pooled one may be just as stale. Once any byte of an
		// answer came, the request is not sent again.
		var nr *nothingReceivedError
		if uc.reused && try == 0 && ctx.Err() == nil && errors.As(err, &nr) {
			continue
		}
		return nil, withCtxErr(ctx, err)
	}
}

func (t *Transport) exchange(ctx context.Context, uc *upConn, req *http.Request, head, body []byte) (*http.Response, error) {
	// Cancelling the request closes the connection: that wakes any read or
	// write blocked on it, and the engine sees the leg cancelled at once
	// even when nobody is reading the answer at that moment (a decode left
	// waiting for a bootstrap that will never come). A connection whose
	// cancellation fired is never pooled (see upBody.finish).
	hook := OnDone(ctx, uc.closeConn)
	uc.outArr = [2][]byte{head, body}
	uc.out = uc.outArr[:]
	err := uc.writeRequest()
	uc.outArr, uc.out = [2][]byte{}, nil // the head's buffer goes back to the pool
	if err != nil {
		hook.Stop()
		if errors.Is(err, net.ErrClosed) || isConnReset(err) {
			return nil, &nothingReceivedError{err} // retryable on a reused conn
		}
		return nil, err
	}
	resp, rb, err := t.readResponse(uc, req)
	if err != nil {
		hook.Stop()
		return nil, err
	}
	ub := &upBody{rc: rb, t: t, uc: uc, hook: hook, ctx: ctx, reusable: !resp.Close}
	if rb == nil {
		// Nothing to wait for (RFC 9112 §6.3): the connection is free now,
		// whether or not the caller reads the empty body.
		ub.finish(true)
		resp.Body = http.NoBody
		return resp, nil
	}
	resp.Body = ub
	return resp, nil
}

// writeRequest sends uc.out, then waits for the answer's first bytes
// without asking the socket for them first: right after the request they
// are not there yet (the engine has yet to read it), and asking costs a
// system call a leg. The write is made inside the poller's wait for bytes
// (RawConn.Read), after the wait has forgotten readiness seen before it
// and before it parks, so bytes arriving at any time after the write wake
// it. The read that follows (readResponse) finds the bytes, or the end or
// error that woke the wait; were the wake-up ever spurious, that read
// waits as any read does. A closed connection (the request cancelled)
// ends the wait at once, and its read reports it.
func (uc *upConn) writeRequest() error {
	if uc.raw == nil {
		_, err := uc.out.WriteTo(uc.c)
		return err
	}
	uc.wrote, uc.writeErr = false, nil
	err := uc.raw.Read(uc.writeInWait)
	if !uc.wrote {
		return err // the connection was closed before the write
	}
	err, uc.writeErr = uc.writeErr, nil
	return err
}

// writeInWait is writeRequest's callback (made once per connection, as
// uc.writeInWait): it writes on the first call and asks to wait unless the
// write failed; woken, it ends the wait.
func (uc *upConn) writeInWaitFunc(uintptr) bool {
	if uc.wrote {
		return true
	}
	uc.wrote = true
	_, uc.writeErr = uc.out.WriteTo(uc.c)
	if uc.afterWrite != nil {
		uc.afterWrite()
	}
	return uc.writeErr != nil
}

// get returns an idle connection to addr that is still open, when pooled
// ones may serve, or a new one.
func (t *Transport) get(ctx context.Context, addr string, pooled bool) (*upConn, error) {
	now := time.Now()
	for pooled {
		t.mu.Lock()
		list := t.idle[addr]
		if len(list) == 0 {
			t.mu.Unlock()
			break
		}
		uc := list[len(list)-1] // the most recently used is the likeliest alive
		list[len(list)-1] = nil
		t.idle[addr] = list[:len(list)-1]
		t.mu.Unlock()
		idle := now.Sub(uc.idleAt)
		if idle > t.idleTimeout || uc.br.Buffered() > 0 || idle >= t.peekAfter && !connAlive(uc.c) {
			uc.c.Close()
			continue
		}
		uc.reused = true
		return uc, nil
	}
	c, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	uc := &upConn{addr: addr, c: c, limit: math.MaxInt64}
	uc.closeConn = func() { _ = c.Close() }
	uc.writeInWait, uc.afterWrite = uc.writeInWaitFunc, t.afterWrite
	uc.br = t.reader(uc)
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			uc.raw = raw
		}
	}
	return uc, nil
}

// reader lends a read buffer to uc.
func (t *Transport) reader(uc *upConn) *bufio.Reader {
	br := t.readers.Get().(*bufio.Reader)
	br.Reset(uc)
	return br
}

// awaitBytes waits until the engine has sent uc more bytes, with uc's read
// buffer back in the pool meanwhile: a stream on a slow decode spends most
// of its life waiting for the next token, and holds no buffer while it
// does. A buffer with bytes in it is kept, and then there is nothing to
// wait for. The wait asks the socket itself (readable), never a readiness
// seen before: bytes that arrived since the last read are found. It ends
// too when the connection is closed (a cancelled request): the read that
// follows reports it.
func (t *Transport) awaitBytes(uc *upConn) {
	if uc.raw == nil || uc.br.Buffered() > 0 {
		return
	}
	t.readers.Put(uc.br)
	uc.br = nil
	_ = waitReadable(uc.raw)
	uc.br = t.reader(uc)
}

// awaitBytesFor waits up to d for uc's next bytes, keeping its read
// buffer: false when none came in time. Bytes already buffered, or a
// connection without a descriptor, answer true at once.
func (t *Transport) awaitBytesFor(uc *upConn, d time.Duration) bool {
	if uc.raw == nil || uc.br.Buffered() > 0 {
		return true
	}
	// The router sets no other deadline on engine connections: their
	// requests end through their contexts.
	if uc.c.SetReadDeadline(time.Now().Add(d)) != nil {
		return true
	}
	err := waitReadable(uc.raw)
	_ = uc.c.SetReadDeadline(time.Time{})
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// waitReadable returns once raw has bytes to read, has reached its end, or
// has failed (or its read deadline passed: the error). It asks the socket
// once (readable); when nothing is there it waits for the poller's word that
// something arrived and takes that word rather than asking again, which
// saves a slow stream a system call a token. The read that follows finds
// the bytes, the end or the error; were the word ever wrong, that read
// waits for them as any read does, only with its buffer.
func waitReadable(raw syscall.RawConn) error {
	asked := false
	return raw.Read(func(fd uintptr) bool {
		if asked {
			return true
		}
		asked = true
		return readable(fd)
	})
}

// put returns a connection whose answer was read in full to the idle pool.
func (t *Transport) put(uc *upConn) {
	addr := uc.addr
	uc.idleAt = time.Now()
	uc.reused = false
	// The answer's reader holds its response, and through it the request
	// (the prompt) and the head: an idle connection must not keep them.
	uc.fixed, uc.chunked = fixedBody{}, chunkedBody{}
	t.mu.Lock()
	if len(t.idle[addr]) >= t.maxIdle {
		t.mu.Unlock()
		uc.c.Close()
		return
	}
	t.idle[addr] = append(t.idle[addr], uc)
	t.mu.Unlock()
}

// CloseIdleConnections closes every idle connection.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*upConn{}
	t.mu.Unlock()
	for _, list := range idle {
		for _, uc := range list {
			uc.c.Close()
		}
	}
	t.fallback.CloseIdleConnections()
}

// upBody is an answer's body: at its clean end the connection goes back to
// the pool; an error or an early Close closes it.
type upBody struct {
	rc       io.Reader // returns io.EOF itself only at the body's clean end
	t        *Transport
	uc       *upConn
	hook     Hooked // closes uc when ctx ends
	ctx      context.Context
	reusable bool
	done     bool
}

// Read reads the answer; at its clean end the connection is pooled, on an
// error it is closed.
func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == nil:
	case err == io.EOF:
		b.finish(true)
	default:
		b.finish(false)
		err = withCtxErr(b.ctx, err)
	}
	return n, err
}

// Await waits for more of a chunked answer without holding a read buffer
// (see Transport.awaitBytes); other answers are short, and their
// readers keep the buffer they were given.
func (b *upBody) Await() {
	if cb, chunked := b.rc.(*chunkedBody); chunked && !b.done {
		cb.skipDataEnd()
		b.t.awaitBytes(b.uc)
	}
}

// AwaitFor is Await bounded by d, with the read buffer kept: false when
// the engine sent nothing more within d.
func (b *upBody) AwaitFor(d time.Duration) bool {
	cb, chunked := b.rc.(*chunkedBody)
	if !chunked || b.done {
		return true
	}
	cb.skipDataEnd()
	return b.t.awaitBytesFor(b.uc, d)
}

// Ready reports whether the next Read returns data without waiting on the
// engine: bytes of the body that already arrived. A relay flushes to the
// client only when nothing is ready, so that events that arrived together
// leave in one write, and none is held back waiting for the next.
func (b *upBody) Ready() bool {
	if b.done {
		return false
	}
	switch rc := b.rc.(type) {
	case *chunkedBody:
		return rc.ready()
	case *fixedBody:
		return rc.n > 0 && rc.br.Buffered() > 0
	case *bufio.Reader: // delimited by the connection's end
		return rc.Buffered() > 0
	}
	return false
}

// AtEnd reports whether the next Read returns io.EOF without reading the
// connection: the answer is over, or all that is left of it (a chunked
// answer's last chunk, without trailers) is buffered.
func (b *upBody) AtEnd() bool {
	if b.done {
		return true
	}
	switch rc := b.rc.(type) {
	case *chunkedBody:
		return rc.atEnd()
	case *fixedBody:
		return rc.n <= 0
	}
	return false
}

// Close ends the answer; a connection not read to the end is closed.
func (b *upBody) Close() error {
	if !b.done {
		b.finish(false)
	}
	return nil
}

func (b *upBody) finish(clean bool) {
	b.done = true
	fired := !b.hook.Stop()
	if clean && b.reusable && !fired {
		b.t.put(b.uc)
		return
	}
	b.uc.c.Close()
}

// AppendRequestHead writes an HTTP/1.1 request head with the body's length.
func AppendRequestHead(b []byte, req *http.Request, bodyLen int) []byte {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	b = AppendRequestLine(b, req.Method, req.URL.RequestURI(), host, bodyLen)
	for k, vs := range req.Header {
		if k == "Content-Length" || k == "Host" || k == "User-Agent" || k == "Connection" {
			continue
		}
		for _, v := range vs {
			b = AppendField(b, k, v)
		}
	}
	return append(b, "\r\n"...)
}

// AppendRequestLine writes a request's line and the fields the transport
// sets: Host, User-Agent and Content-Length. The caller's fields follow
// (AppendField), then the blank line.
func AppendRequestLine(b []byte, method, uri, host string, bodyLen int) []byte {
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: pdplane-router\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(bodyLen), 10)
	return append(b, "\r\n"...)
}

// AppendField writes one field of a request head; a value with a
// line break, which would end the field early, is left out.
func AppendField(b []byte, k, v string) []byte {
	if strings.ContainsAny(v, "\r\n") {
		return b
	}
	b = append(b, k...)
	b = append(b, ": "...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}

// DialAddr is the address to dial for u: its host:port, with port 80 when
// it names none.
func DialAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host // host:port already, an engine's URL as registered
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// withCtxErr reports a cancelled or expired request as such, not as the
// I/O error its cancellation caused.
func withCtxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

// readResponse reads an answer's head, skipping interim (1xx) ones, and
// returns it with a reader of its body, nil when it has none. Sections are
// those of RFC 9112 unless said otherwise.
func (t *Transport) readResponse(uc *upConn, req *http.Request) (*http.Response, io.Reader, error) {
	// One budget for every head of this answer: an endless head, or an
	// endless run of interim answers, fails at about maxHead bytes. Bytes
	// of the body that came with the head are spent from it too, hence the
	// read buffer's worth more.
	uc.limit = t.maxHead + int64(t.readBuf)
	defer func() { uc.limit = math.MaxInt64 }()
	if _, err := uc.br.Peek(1); err != nil {
		return nil, nil, &nothingReceivedError{err}
	}
	for {
		head, err := readHead(uc.br, true)
		if err != nil {
			return nil, nil, err
		}
		resp, err := parseHead(head, req)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			// RFC 9110 §7.8: never asked for, as no Upgrade is sent.
			return nil, nil, errors.New("upstream answer: 101 Switching Protocols without an Upgrade asked for")
		case resp.StatusCode < 200:
			continue // §4 and RFC 9110 §15.2: interim, the final answer follows
		}
		body, err := t.framing(resp, uc, req)
		if err != nil {
			return nil, nil, err
		}
		return resp, body, nil
	}
}

// framing sets the answer's length and connection fields and returns the
// reader of its body (§6.3), nil when it has none.
func (t *Transport) framing(resp *http.Response, uc *upConn, req *http.Request) (io.Reader, error) {
	h := resp.Header
	te, hasTE := h["Transfer-Encoding"]
	cl, hasCL := h["Content-Length"]
	// §9.3, §9.6: Connection: close ends the connection after this answer;
	// HTTP/1.0 connections are not kept (keep-alive is not spoken).
	head := req != nil && req.Method == http.MethodHead // a nil req is a POST
	resp.Close = req != nil && req.Close || resp.ProtoMinor == 0 || hasToken(h["Connection"], "close")
	resp.ContentLength = -1
	noBody := head || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified // §6.3(1)
	var n int64
	switch {
	case hasTE:
		if resp.ProtoMinor == 0 {
			// §6.1: Transfer-Encoding in HTTP/1.0 is faulty framing.
			return nil, errors.New("upstream answer: Transfer-Encoding in an HTTP/1.0 answer")
		}
		if hasCL {
			// §6.3(3): Transfer-Encoding overrides Content-Length, but a
			// message with both may be an attempt at response splitting:
			// the connection is not trusted with another request.
			delete(h, "Content-Length")
			resp.Close = true
		}
		if noBody {
			break
		}
		// §6.3(4): chunked must be the final coding; it is the only one
		// spoken, and a message with another one fails.
		if !onlyChunked(te) {
			return nil, fmt.Errorf("upstream answer: unsupported Transfer-Encoding %.64q", strings.Join(te, ", "))
		}
		delete(h, "Transfer-Encoding")
		resp.TransferEncoding = []string{"chunked"}
		uc.chunked = chunkedBody{uc: uc, resp: resp, maxTrailer: t.maxHead}
		return &uc.chunked, nil
	case hasCL:
		var err error
		if n, err = parseContentLength(cl); err != nil {
			return nil, err // §6.3(5): unrecoverable
		}
		resp.ContentLength = n
		if head {
			return nil, nil // the length of the body a GET would have had
		}
	}
	switch {
	case noBody:
		if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
			resp.ContentLength = 0
		}
		return nil, nil
	case hasCL && n == 0:
		return nil, nil
	case hasCL:
		uc.fixed = fixedBody{br: uc.br, n: n}
		return &uc.fixed, nil
	}
	// §6.3(8): no length, the body ends when the connection does.
	resp.Close = true
	return uc.br, nil
}

// parseContentLength reads Content-Length: 1*DIGIT; repeated identical
// values (in lines or a list) are one value, differing ones an error
// (RFC 9110 §8.6, RFC 9112 §6.3(5)).
func parseContentLength(vs []string) (int64, error) {
	n := int64(-1)
	for _, v := range vs {
		for rest, more := v, true; more; {
			var f string
			f, rest, more = strings.Cut(rest, ",")
			f = strings.TrimSpace(f)
			m, err := strconv.ParseInt(f, 10, 64)
			if err != nil || f == "" || !isDigit(f[0]) {
				return 0, fmt.Errorf("upstream answer: invalid Content-Length %.64q", v)
			}
			if n >= 0 && m != n {
				return 0, fmt.Errorf("upstream answer: differing Content-Length values %.64q", strings.Join(vs, ", "))
			}
			n = m
		}
	}
	if n < 0 {
		return 0, errors.New("upstream answer: empty Content-Length")
	}
	return n, nil
}

// fixedBody is a body of Content-Length bytes (§6.2); the connection ending
// before them is an error (§8).
type fixedBody struct {
	br *bufio.Reader
	n  int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	if b.n == 0 {
		return n, io.EOF
	}
	return n, unexpectedEOF(err)
}

// chunkedBody decodes the chunked coding (§7.1): chunk sizes in hex with
// extensions ignored (§7.1.1), each chunk's data followed by CRLF, a last
// chunk of size 0, then trailer fields (§7.1.2), consumed so that the
// connection is left at the next answer, and set on resp.Trailer.
type chunkedBody struct {
	uc         *upConn
	resp       *http.Response
	maxTrailer int64
	n          int64 // bytes left in the current chunk
	afterData  bool  // a chunk's data ended: CRLF comes next
	err        error // sticky: io.EOF at the clean end
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	br := b.uc.br
	if b.n == 0 {
		if b.afterData {
			crlf, err := br.Peek(2)
			if err != nil {
				return 0, b.fail(unexpectedEOF(err))
			}
			if crlf[0] != '\r' || crlf[1] != '\n' {
				return 0, b.fail(errors.New("upstream answer: chunk data not followed by CRLF"))
			}
			_, _ = br.Discard(2)
			b.afterData = false
		}
		size, err := readChunkSize(br)
		if err != nil {
			return 0, b.fail(err)
		}
		if size == 0 {
			if err := b.readTrailers(); err != nil {
				return 0, b.fail(err)
			}
			b.err = io.EOF
			return 0, io.EOF
		}
		b.n = size
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := br.Read(p)
	b.n -= int64(n)
	if b.n == 0 {
		b.afterData = true
	}
	if err != nil {
		return n, b.fail(unexpectedEOF(err))
	}
	return n, nil
}

// ready reports whether Read returns data without reading the connection:
// the current chunk has buffered bytes, or the buffer holds the end of the
// chunk, the next chunk's size line (not the last chunk's) and some of its
// data.
func (b *chunkedBody) ready() bool {
	if b.err != nil {
		return false
	}
	if b.n > 0 {
		return b.uc.br.Buffered() > 0
	}
	size, rest, ok := b.bufferedSizeLine()
	return ok && len(rest) > 0 && len(bytes.Trim(size, "0\r\t ")) > 0
}

// atEnd reports whether Read returns io.EOF without reading the
// connection: the body ended, or the buffer holds the end of the current
// chunk's data and the last chunk with an empty trailer section. (An answer
// with trailers is not at its end until they are read.)
func (b *chunkedBody) atEnd() bool {
	if b.err != nil {
		return b.err == io.EOF
	}
	if b.n > 0 {
		return false
	}
	size, rest, ok := b.bufferedSizeLine()
	return ok && len(bytes.Trim(size, "\r\t ")) > 0 && len(bytes.Trim(size, "0\r\t ")) == 0 &&
		bytes.HasPrefix(rest, crlf)
}

// bufferedSizeLine finds, in what is buffered only (it never waits), the
// next chunk's size line after the current chunk's data: its size without
// extensions, and the bytes after the line. ok is false when the line has
// not arrived whole.
func (b *chunkedBody) bufferedSizeLine() (size, rest []byte, ok bool) {
	br := b.uc.br
	buf, _ := br.Peek(br.Buffered())
	if b.afterData {
		if len(buf) < 2 {
			return nil, nil, false
		}
		buf = buf[2:]
	}
	i := bytes.IndexByte(buf, '\n')
	if i < 0 {
		return nil, nil, false
	}
	size = buf[:i]
	if j := bytes.IndexByte(size, ';'); j >= 0 {
		size = size[:j]
	}
	return size, buf[i+1:], true
}

// skipDataEnd consumes the CRLF that ends a chunk's data when it has
// arrived, so that a stream between events has nothing left in its buffer.
// Anything else there is left for Read to report.
func (b *chunkedBody) skipDataEnd() {
	br := b.uc.br
	if b.err != nil || !b.afterData || br.Buffered() < 2 {
		return
	}
	if crlf, _ := br.Peek(2); crlf[0] == '\r' && crlf[1] == '\n' {
		_, _ = br.Discard(2)
		b.afterData = false
	}
}

func (b *chunkedBody) fail(err error) error {
	b.err = err
	return err
}

// readChunkSize reads chunk-size [ chunk-ext ] CRLF. The line must fit the
// read buffer.
func readChunkSize(br *bufio.Reader) (int64, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return 0, errors.New("upstream answer: chunk size line too long")
	case err != nil:
		return 0, unexpectedEOF(err)
	case len(line) < 2 || line[len(line)-2] != '\r':
		return 0, errors.New("upstream answer: chunk size line not ended by CRLF")
	}
	line = line[:len(line)-2]
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i] // chunk-ext, after optional whitespace (BWS)
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 {
		return 0, errors.New("upstream answer: empty chunk size")
	}
	var n int64
	for _, c := range line {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("upstream answer: invalid chunk size %.32q", line)
		}
		if n > math.MaxInt64>>4 {
			return 0, fmt.Errorf("upstream answer: chunk size %.32q too large", line)
		}
		n = n<<4 | int64(d)
	}
	return n, nil
}

// readTrailers reads the trailer section after the last chunk, bounded as a
// head is.
func (b *chunkedBody) readTrailers() error {
	b.uc.limit = b.maxTrailer + int64(b.uc.br.Size())
	defer func() { b.uc.limit = math.MaxInt64 }()
	sec, err := readHead(b.uc.br, false)
	if err != nil {
		return fmt.Errorf("trailers: %w", err)
	}
	hdr, err := parseFields(sec)
	if err != nil {
		return fmt.Errorf("trailers: %w", err)
	}
	for k, vs := range hdr {
		if b.resp.Trailer == nil {
			b.resp.Trailer = http.Header{}
		}
		b.resp.Trailer[k] = append(b.resp.Trailer[k], vs...)
	}
	return nil
}

// unexpectedEOF reports a message cut short (§8) as such: io.EOF is a
// body's clean end to its readers.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// eachToken calls f with each member of comma-separated field values,
// dropping empty ones (RFC 9110 §5.6.1), until f returns false.
func eachToken(vs []string, f func(string) bool) {
	for _, v := range vs {
		for v != "" {
			var m string
			m, v, _ = strings.Cut(v, ",")
			if m = strings.TrimSpace(m); m != "" && !f(m) {
				return
			}
		}
	}
}

func hasToken(vs []string, tok string) bool {
	found := false
	eachToken(vs, func(m string) bool {
		found = strings.EqualFold(m, tok)
		return !found
	})
	return found
}

// onlyChunked says whether vs name the chunked coding alone.
func onlyChunked(vs []string) bool {
	n, chunked := 0, false
	eachToken(vs, func(m string) bool {
		n++
		chunked = strings.EqualFold(m, "chunked")
		return true
	})
	return n == 1 && chunked
}

// newTransport is the net/http transport for engines the Transport does
// not speak to itself (https): a large idle pool per engine (each
// request opens two legs), no compression (bytes are relayed as they come),
// no proxy from the environment.
func newTransport(cfg TransportConfig) *http.Transport {
	d := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// Small connection buffers keep an open stream's footprint low:
		// SSE events are far smaller, and large request bodies bypass the
		// write buffer.
		ReadBufferSize:  2 << 10,
		WriteBufferSize: 2 << 10,
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
