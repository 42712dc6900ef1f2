package router

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// upstreamTransport is the router's HTTP/1.1 client for engine legs. Unlike
// net/http.Transport it keeps no goroutines per connection: a request is
// written (head and body in one writev) and its answer read on the caller's
// goroutine, and an idle connection is a socket and a read buffer. An open
// stream therefore costs the router about half the memory, and a request
// fewer goroutine wake-ups. It speaks plain http:// only; anything else goes
// to the fallback transport.
//
// Idle connections are checked before reuse (a non-blocking peek sees an
// engine that closed them) and dropped after idleTimeout, which is shorter
// than the 5 s keep-alive of uvicorn, the server of SGLang and vLLM. A
// request that finds its reused connection closed before any byte of an
// answer is sent again once on a new connection.
type upstreamTransport struct {
	dialer      net.Dialer
	maxIdle     int           // idle connections kept per host
	idleTimeout time.Duration // idle connections older than this are closed
	readBuf     int
	fallback    *http.Transport

	mu   sync.Mutex
	idle map[string][]*upConn
}

// upConn is one connection to an engine.
type upConn struct {
	addr   string // host:port as dialled, the idle pool's key
	c      net.Conn
	br     *bufio.Reader
	idleAt time.Time
	reused bool
}

func newUpstreamTransport(cfg *Config) *upstreamTransport {
	return &upstreamTransport{
		dialer:      net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second},
		maxIdle:     cfg.MaxIdleConnsPerHost,
		idleTimeout: 4 * time.Second,
		readBuf:     2 << 10,
		fallback:    newTransport(cfg),
		idle:        map[string][]*upConn{},
	}
}

// upstreamBody is a request body the transport can write without copying.
type upstreamBody struct {
	*bytes.Reader
	b []byte
}

func (*upstreamBody) Close() error { return nil }

func newUpstreamBody(b []byte) *upstreamBody { return &upstreamBody{bytes.NewReader(b), b} }

// RoundTrip sends one request and returns the answer, whose body must be
// read to the end or closed (on the caller's goroutine).
func (t *upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	var body []byte
	if ub, ok := req.Body.(*upstreamBody); ok {
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
	head := appendRequestHead(make([]byte, 0, 256), req, len(body))
	addr := hostPort(req)
	for try := 0; ; try++ {
		uc, err := t.get(ctx, addr)
		if err != nil {
			return nil, withCtxErr(ctx, err)
		}
		resp, err := t.exchange(ctx, uc, req, head, body)
		if err == nil {
			return resp, nil
		}
		uc.c.Close()
		// An engine that closed an idle connection as it was taken: send
		// again, once, on a new one.
		if uc.reused && try == 0 && ctx.Err() == nil && errors.Is(err, io.EOF) {
			continue
		}
		return nil, withCtxErr(ctx, err)
	}
}

func (t *upstreamTransport) exchange(ctx context.Context, uc *upConn, req *http.Request, head, body []byte) (*http.Response, error) {
	// Cancelling the request closes the connection: that wakes any read or
	// write blocked on it, and the engine sees the leg cancelled at once
	// even when nobody is reading the answer at that moment (a decode left
	// waiting for a bootstrap that will never come). A connection whose
	// cancellation fired is never pooled (see upBody.finish).
	stop := context.AfterFunc(ctx, func() { _ = uc.c.Close() })
	bufs := net.Buffers{head, body}
	if _, err := bufs.WriteTo(uc.c); err != nil {
		stop()
		if errors.Is(err, net.ErrClosed) || isConnReset(err) {
			return nil, errors.Join(io.EOF, err) // nothing answered: retryable on a reused conn
		}
		return nil, err
	}
	resp, err := http.ReadResponse(uc.br, req)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(uc.br, req)
	}
	if err != nil {
		stop()
		return nil, err
	}
	resp.Body = &upBody{rc: resp.Body, t: t, uc: uc, stop: stop, ctx: ctx, reusable: !resp.Close && !req.Close}
	return resp, nil
}

// get returns an idle connection to addr that is still open, or a new one.
func (t *upstreamTransport) get(ctx context.Context, addr string) (*upConn, error) {
	now := time.Now()
	for {
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
		if now.Sub(uc.idleAt) > t.idleTimeout || uc.br.Buffered() > 0 || !connAlive(uc.c) {
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
	return &upConn{addr: addr, c: c, br: bufio.NewReaderSize(c, t.readBuf)}, nil
}

// put returns a connection whose answer was read in full to the idle pool.
func (t *upstreamTransport) put(uc *upConn) {
	addr := uc.addr
	uc.idleAt = time.Now()
	uc.reused = false
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
func (t *upstreamTransport) CloseIdleConnections() {
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
	rc       io.ReadCloser
	t        *upstreamTransport
	uc       *upConn
	stop     func() bool
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
	case errors.Is(err, io.EOF):
		b.finish(true)
	default:
		b.finish(false)
		err = withCtxErr(b.ctx, err)
	}
	return n, err
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
	fired := !b.stop()
	if clean && b.reusable && !fired {
		b.t.put(b.uc)
		return
	}
	b.uc.c.Close()
}

// appendRequestHead writes an HTTP/1.1 request head with the body's length.
func appendRequestHead(b []byte, req *http.Request, bodyLen int) []byte {
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, req.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: pdplane-router\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(bodyLen), 10)
	b = append(b, "\r\n"...)
	for k, vs := range req.Header {
		if k == "Content-Length" || k == "Host" || k == "User-Agent" || k == "Connection" {
			continue
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n") {
				continue
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

func hostPort(req *http.Request) string {
	h, p := req.URL.Hostname(), req.URL.Port()
	if p == "" {
		p = "80"
	}
	return net.JoinHostPort(h, p)
}

// withCtxErr reports a cancelled or expired request as such, not as the
// I/O error its cancellation caused.
func withCtxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
