//go:build linux

package httpwire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// frontServer serves h through a Listener with the front on, as pdplane
// serve does; served counts the requests h answered through the front's
// writer and through net/http's.
type frontServer struct {
	addr              string
	ln                *Listener
	watcher           *Watcher
	byFront, byNetHTP atomic.Int64
}

func startFront(t *testing.T, headTimeout, idle time.Duration, h http.HandlerFunc) *frontServer {
	t.Helper()
	rt := testWatcher(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &frontServer{addr: tcp.Addr().String(), watcher: rt}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(*frontWriter); ok {
			fs.byFront.Add(1)
			// As net/http's: Host moved to Request.Host, no body is NoBody.
			if _, ok := r.Header["Host"]; ok || r.Host == "" || (r.ContentLength == 0) != (r.Body == http.NoBody) {
				t.Errorf("front's request: Host %q, header %v, length %d, body %T", r.Host, r.Header, r.ContentLength, r.Body)
			}
		} else {
			fs.byNetHTP.Add(1)
		}
		h(w, r)
	})
	fs.ln = NewListener(tcp, idle)
	if !fs.ln.Front(counted, headTimeout, rt) {
		t.Fatal("no connection watcher: the front is Linux's")
	}
	srv := &http.Server{Handler: counted, ReadHeaderTimeout: headTimeout, IdleTimeout: idle}
	go func() { _ = srv.Serve(fs.ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		fs.ln.CloseFront()
	})
	return fs
}

// watching is how many connections the front's watcher watches for a
// client leaving.
func (fs *frontServer) watching() int {
	fs.watcher.mu.Lock()
	defer fs.watcher.mu.Unlock()
	return len(fs.watcher.conns)
}

func (fs *frontServer) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", fs.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func rawPost(path, body string, fields ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, len(body))
	for _, f := range fields {
		b.WriteString(f + "\r\n")
	}
	b.WriteString("\r\n" + body)
	return b.String()
}

func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer's body: %v", err)
	}
	return resp, string(b)
}

// readThenWait reads r's body, says so on read, then waits d for its
// context to end: the cause if it did, nil if not.
func readThenWait(r *http.Request, read chan<- struct{}, d time.Duration) error {
	_, _ = io.ReadAll(r.Body)
	read <- struct{}{}
	select {
	case <-r.Context().Done():
		return context.Cause(r.Context())
	case <-time.After(d):
		return nil
	}
}

// waitDone fails t unless ch yields within a few seconds.
func waitDone(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not within 5 s", what)
	}
}

func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// The front serves generation requests, pipelined too, on one connection
// until one is not its own; that one and the rest of the connection are
// net/http's, with nothing lost in the handover.
func TestFrontServesGenerationRequestsAndHandsOverTheRest(t *testing.T) {
	fs := startFront(t, 5*time.Second, time.Minute, echo)
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/v1/completions", `{"a":1}`)+rawPost("/generate", `{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"a":1}`, `{"b":2}`} {
		resp, body := readAnswer(t, br)
		if resp.StatusCode != 200 || body != want || resp.ContentLength != int64(len(want)) || resp.Header.Get("Date") == "" ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("answer %d %q, length %d, header %v; want 200 %q with its length and a Date", resp.StatusCode, body, resp.ContentLength, resp.Header, want)
		}
	}
	// Another route on the same connection, then a generation request
	// behind it, sent together: both are net/http's now.
	if _, err := io.WriteString(c, rawPost("/api/v1/other", `{"c":3}`)+rawPost("/v1/chat/completions", `{"d":4}`)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"c":3}`, `{"d":4}`} {
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != want {
			t.Fatalf("answer %d %q; want 200 %q", resp.StatusCode, body, want)
		}
	}
	if f, n := fs.byFront.Load(), fs.byNetHTP.Load(); f != 2 || n != 2 {
		t.Fatalf("%d answered by the front, %d by net/http; want 2 and 2", f, n)
	}
}

// A client that lists the models first, as OpenAI's SDKs are often used,
// keeps its connection on the front for what follows. The GET is the head
// the OpenAI Python SDK sends (openai 3.57.0 on httpx 0.28.1, captured),
// its POST too, on one kept-alive connection.
func TestFrontServesTheModelListBeforeGenerations(t *testing.T) {
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
			return
		}
		echo(w, r)
	})
	sdk := "\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nauthorization: Bearer sk-test\r\naccept: application/json\r\n" +
		"user-agent: OpenAI/Python 3.57.0\r\nx-stainless-lang: python\r\nx-stainless-package-version: 3.57.0\r\nx-stainless-os: Linux\r\n" +
		"x-stainless-arch: x64\r\nx-stainless-runtime: CPython\r\nx-stainless-runtime-version: 3.11.7\r\nx-stainless-async: false\r\n" +
		"x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\n"
	body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hello"}],"max_tokens":8}`
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:8080"+sdk+"\r\n"+
		"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080"+sdk+"content-type: application/json\r\n"+
		fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"object":"list","data":[]}`, body} {
		if resp, got := readAnswer(t, br); resp.StatusCode != 200 || got != want {
			t.Fatalf("answer %d %q, want %q", resp.StatusCode, got, want)
		}
	}
	// A GET with a body (a length) is net/http's, as is a GET elsewhere.
	if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	readAnswer(t, br)
	if f, n := fs.byFront.Load(), fs.byNetHTP.Load(); f != 2 || n != 1 {
		t.Fatalf("%d answered by the front, %d by net/http; want 2 and 1", f, n)
	}
}

// An answer gets the framing net/http would give it.
func TestFrontFramesAnswersAsNetHTTPDoes(t *testing.T) {
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch r.Header.Get("X-Case") {
		case "small":
			_, _ = w.Write([]byte("hello"))
		case "big":
			_, _ = w.Write([]byte(strings.Repeat("x", 10000)))
		case "flush":
			_, _ = w.Write([]byte("a"))
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte("b"))
		case "no-content":
			w.WriteHeader(http.StatusNoContent)
		case "close":
			w.Header().Set("Connection", "close")
			_, _ = w.Write([]byte("bye"))
		case "error":
			http.Error(w, "no", http.StatusTeapot)
		case "own-chunked":
			w.Header().Set("Transfer-Encoding", "chunked")
			_, _ = w.Write([]byte("abc"))
		case "late-header":
			w.WriteHeader(http.StatusOK)
			w.Header().Set("X-Late", "1") // after WriteHeader: not sent, as by net/http
			_, _ = w.Write([]byte("late"))
		case "over-length":
			w.Header().Set("Content-Length", "3")
			if n, err := w.Write([]byte("abcd")); n != 0 || !errors.Is(err, http.ErrContentLength) {
				t.Errorf("a write past Content-Length: %d, %v; want 0, %v", n, err, http.ErrContentLength)
			}
			_, _ = w.Write([]byte("abc"))
		}
	})
	for _, tc := range []struct {
		name, field string
		status      int
		body        string
		length      int64 // -1: chunked
		closes      bool
	}{
		{"small", "", 200, "hello", 5, false},
		{"big", "", 200, strings.Repeat("x", 10000), -1, false},
		{"flush", "", 200, "ab", -1, false},
		{"no-content", "", 204, "", 0, false},
		{"close", "", 200, "bye", 3, true},
		{"error", "", 418, "no\n", 3, false},
		{"small", "Connection: close", 200, "hello", 5, true},
		{"own-chunked", "", 200, "abc", -1, false},
		{"late-header", "", 200, "late", 4, false},
		{"over-length", "", 200, "abc", 3, false},
	} {
		t.Run(tc.name+tc.field, func(t *testing.T) {
			c, br := fs.dial(t)
			fields := []string{"X-Case: " + tc.name}
			if tc.field != "" {
				fields = append(fields, tc.field)
			}
			if _, err := io.WriteString(c, rawPost("/generate", "{}", fields...)); err != nil {
				t.Fatal(err)
			}
			resp, body := readAnswer(t, br)
			chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"
			if resp.StatusCode != tc.status || body != tc.body || (tc.length < 0) != chunked || tc.length >= 0 && resp.ContentLength != tc.length {
				t.Fatalf("answer %d, %d bytes, length %d, chunked %v; want %d, %d bytes, length %d", resp.StatusCode, len(body),
					resp.ContentLength, chunked, tc.status, len(tc.body), tc.length)
			}
			// net/http sniffs one, but not under the handler's own
			// Transfer-Encoding (TestFrontHeadFieldsAsNetHTTP).
			if tc.status == 200 && tc.name != "own-chunked" && resp.Header.Get("Content-Type") == "" {
				t.Fatal("no Content-Type (net/http sniffs one)")
			}
			if resp.Header.Get("X-Late") != "" {
				t.Fatal("a field set after WriteHeader was sent")
			}
			if resp.Close != tc.closes {
				t.Fatalf("Connection: close %v, want %v", resp.Close, tc.closes)
			}
			if tc.closes {
				if _, err := br.ReadByte(); err != io.EOF {
					t.Fatalf("after a closing answer: %v, want EOF", err)
				}
			}
		})
	}
	if n := fs.byNetHTP.Load(); n != 0 {
		t.Fatalf("%d answered by net/http", n)
	}
}

// A head the front would need more judgment for, or that is no
// generation request, is net/http's to judge: the front never serves it.
// Request smuggling lives in such heads (RFC 9112 §6.3, §11.2).
func TestFrontLeavesOddHeadsToNetHTTP(t *testing.T) {
	fs := startFront(t, 2*time.Second, time.Minute, echo)
	long := "X-Long: " + strings.Repeat("y", frontBufSize)
	for name, raw := range map[string]string{
		"chunked and a length":    "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"chunked":                 "POST /generate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"two lengths":             "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
		"a signed length":         "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: +2\r\n\r\n{}",
		"a list as length":        "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 2, 2\r\n\r\n{}",
		"no length":               "POST /generate HTTP/1.1\r\nHost: t\r\n\r\n",
		"a folded line":           "POST /generate HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\n{}",
		"bare LF":                 "POST /generate HTTP/1.1\nHost: t\nContent-Length: 2\n\n{}",
		"a head ended by LF CRLF": "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 2\n\r\nX-A: b\r\n\r\n{}",
		"HTTP/1.0":                "POST /generate HTTP/1.0\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
		"expect":                  "POST /generate HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
		"a query":                 "POST /generate?x=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
		"an absolute target":      "POST http://t/generate HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
		"a lower-case method":     "post /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
		"a space in a name":       "POST /generate HTTP/1.1\r\nHost: t\r\nContent Length: 2\r\n\r\n{}",
		"a space before colon":    "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length : 2\r\n\r\n{}",
		"a NUL in a value":        "POST /generate HTTP/1.1\r\nHost: t\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
		"a CR in a value":         "POST /generate HTTP/1.1\r\nHost: t\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\n{}",
		"no host":                 "POST /generate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
		"a host with a space":     "POST /generate HTTP/1.1\r\nHost: a b\r\nContent-Length: 2\r\n\r\n{}",
		"two hosts":               "POST /generate HTTP/1.1\r\nHost: t\r\nHost: u\r\nContent-Length: 2\r\n\r\n{}",
		"an upgrade":              "POST /generate HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 2\r\n\r\n{}",
		"a head over a buffer":    "POST /generate HTTP/1.1\r\nHost: t\r\n" + long + "\r\nContent-Length: 2\r\n\r\n{}",
		"a GET":                   "GET /generate HTTP/1.1\r\nHost: t\r\n\r\n",
		"a GET of another path":   "GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
		"a HEAD of the models":    "HEAD /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
		"a POST of the models":    "POST /v1/models HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
		"a GET with chunks":       "GET /v1/models HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"garbage":                 "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
		"another connection op":   "POST /generate HTTP/1.1\r\nHost: t\r\nConnection: keep-alive, Upgrade\r\nContent-Length: 2\r\n\r\n{}",
	} {
		t.Run(name, func(t *testing.T) {
			before := fs.byFront.Load()
			c, br := fs.dial(t)
			if _, err := io.WriteString(c, raw); err != nil {
				t.Fatal(err)
			}
			// net/http answers (400 or the echo) or closes; either way
			// the front served nothing.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if resp, err := http.ReadResponse(br, nil); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			if n := fs.byFront.Load() - before; n != 0 {
				t.Fatalf("the front served %d request(s) of %q", n, raw)
			}
		})
	}
}

// startWaitingFront serves a handler that reads the body, then waits 100 ms
// for each "w" of X-Wait and answers "done", unless the request's context
// ends first; each request's body read goes to read, and its end (nil, or
// the context's cause) to causes.
func startWaitingFront(t *testing.T) (fs *frontServer, read chan struct{}, causes chan error) {
	read, causes = make(chan struct{}, 8), make(chan error, 8)
	fs = startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		err := readThenWait(r, read, time.Duration(len(r.Header.Get("X-Wait")))*100*time.Millisecond)
		causes <- err
		if err == nil {
			_, _ = w.Write([]byte("done"))
		}
	})
	return fs, read, causes
}

// wantClientClosed fails t unless the next request to end ends with
// errClientClosed within a few seconds.
func wantClientClosed(t *testing.T, causes <-chan error) {
	t.Helper()
	select {
	case err := <-causes:
		if !errors.Is(err, errClientClosed) {
			t.Fatalf("the request ended with %v, want %v", err, errClientClosed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client left and its request ran on")
	}
}

// A client that closes its connection while its request runs cancels the
// request's context, as net/http's background read does; one that sends
// its next request meanwhile (pipelining) cancels nothing, and gets both
// answers.
func TestFrontCancelsTheRequestOfAClientThatLeaves(t *testing.T) {
	fs, read, causes := startWaitingFront(t)

	c, _ := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Wait: "+strings.Repeat("w", 100))); err != nil {
		t.Fatal(err)
	}
	waitDone(t, "the request to run", read)
	_ = c.Close()
	wantClientClosed(t, causes)

	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Wait: www")); err != nil {
		t.Fatal(err)
	}
	waitDone(t, "the first request to run", read) // the next comes while it runs
	if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Wait: w")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != "done" {
			t.Fatalf("answer %d: %d %q", i, resp.StatusCode, body)
		}
		if err := <-causes; err != nil {
			t.Fatalf("request %d ended with %v", i, err)
		}
	}
}

// The watch for a client that leaves runs on a timer the connection keeps
// from request to request: a request that outlived the watch delay, then
// short ones, then a long one the client leaves, which is cancelled.
func TestFrontWatchesEachRequestOfAConnection(t *testing.T) {
	fs, _, causes := startWaitingFront(t)
	c, br := fs.dial(t)
	for i, wait := range []string{"www", "", "w", ""} { // 300 ms: past the watch delay
		if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Wait: "+wait)); err != nil {
			t.Fatal(err)
		}
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != "done" {
			t.Fatalf("answer %d: %d %q", i, resp.StatusCode, body)
		}
		if err := <-causes; err != nil {
			t.Fatalf("request %d ended with %v", i, err)
		}
	}
	if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Wait: "+strings.Repeat("w", 100))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the long request's watch to start", func() bool { return fs.watching() == 1 })
	_ = c.Close()
	wantClientClosed(t, causes)
}

// A head must come whole within the head timeout: a silent connection is
// closed, a slow head goes to net/http, which times it out too. Between
// requests the connection may stay idle up to the idle timeout.
func TestFrontTimesOutHeadsAndIdleConnections(t *testing.T) {
	const head, idle = 200 * time.Millisecond, 400 * time.Millisecond
	fs := startFront(t, head, idle, echo)
	closedWithin := func(c net.Conn, br *bufio.Reader, d time.Duration) {
		t.Helper()
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			if _, err := br.ReadByte(); err != nil {
				if time.Since(start) > d {
					t.Fatalf("closed after %v, want within %v", time.Since(start), d)
				}
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("never closed")
				}
				return
			}
		}
	}
	c, br := fs.dial(t)
	closedWithin(c, br, 3*time.Second)

	c, br = fs.dial(t)
	if _, err := io.WriteString(c, "POST /generate HTTP/1.1\r\nHost: t\r\n"); err != nil {
		t.Fatal(err)
	}
	closedWithin(c, br, 3*time.Second)

	c, br = fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	readAnswer(t, br)
	time.Sleep(idle / 2) // the point: a connection idle for less than the idle timeout is kept
	if _, err := io.WriteString(c, rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	readAnswer(t, br) // within the idle time: served
	closedWithin(c, br, 3*time.Second)
}

// A shutdown's DisableKeepAlives closes the idle connections at once and
// makes an answer in progress the connection's last.
func TestFrontKeepAlivesOff(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.Header.Get("X-Hold") != "" {
			close(held)
			<-release
		}
		_, _ = w.Write([]byte("ok"))
	})
	idle, idleBR := fs.dial(t)
	if _, err := io.WriteString(idle, rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	readAnswer(t, idleBR)
	busy, busyBR := fs.dial(t)
	if _, err := io.WriteString(busy, rawPost("/generate", "{}", "X-Hold: 1")); err != nil {
		t.Fatal(err)
	}
	waitDone(t, "the busy connection's answer to be in progress", held)
	fs.ln.DisableKeepAlives()
	if _, err := idleBR.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection after DisableKeepAlives: %v, want EOF", err)
	}
	close(release)
	resp, body := readAnswer(t, busyBR)
	if body != "ok" || !resp.Close {
		t.Fatalf("answer in progress: %q, Connection: close %v; want ok and close", body, resp.Close)
	}
	if _, err := busyBR.ReadByte(); err != io.EOF {
		t.Fatalf("after its last answer: %v, want EOF", err)
	}
}

// A handler's panic closes its own connection only; a body it left unread
// is read away before the connection's next request.
func TestFrontPanicsAndUnreadBodies(t *testing.T) {
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Case") {
		case "panic":
			panic(http.ErrAbortHandler)
		case "unread":
			_, _ = w.Write([]byte("skipped"))
		default:
			echo(w, r)
		}
	})
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Case: panic")); err != nil {
		t.Fatal(err)
	}
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Fatal("an answer after the handler panicked")
	}
	c, br = fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", strings.Repeat("z", 10000), "X-Case: unread")+rawPost("/generate", `{"e":5}`)); err != nil {
		t.Fatal(err)
	}
	if _, body := readAnswer(t, br); body != "skipped" {
		t.Fatalf("first answer %q", body)
	}
	if _, body := readAnswer(t, br); body != `{"e":5}` {
		t.Fatalf("second answer %q: the first's body was not read away", body)
	}
}

// Hijack hands over the connection with what the client sent ahead, as
// net/http's does (the router's takeover relies on it).
func TestFrontHijack(t *testing.T) {
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer c.Close()
		ahead := brw.Reader.Buffered()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Ahead: %d\r\n\r\nhi", ahead)
	})
	c, br := fs.dial(t)
	next := rawPost("/generate", "{}")
	if _, err := io.WriteString(c, rawPost("/generate", "{}")+next); err != nil {
		t.Fatal(err)
	}
	resp, body := readAnswer(t, br)
	if body != "hi" || resp.Header.Get("X-Ahead") != fmt.Sprint(len(next)) {
		t.Fatalf("hijacked answer %q, %s bytes ahead; want hi, %d", body, resp.Header.Get("X-Ahead"), len(next))
	}
}

// CloseFront, a shutdown's last resort, closes the front's connections and
// cancels the requests in flight on them.
func TestCloseFrontCutsRequestsInFlight(t *testing.T) {
	read, causes := make(chan struct{}, 1), make(chan error, 1)
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		causes <- readThenWait(r, read, 10*time.Second)
	})
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	waitDone(t, "the request to run", read)
	fs.ln.CloseFront()
	if err := <-causes; !errors.Is(err, errStreamCut) {
		t.Fatalf("the request in flight ended with %v, want %v", err, errStreamCut)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection outlived CloseFront")
	}
}

// An answer shorter than its declared Content-Length closes the
// connection (the client would take the next answer for its rest), and
// one sent while more of the body than the front reads away is unread says
// Connection: close, as net/http's do.
func TestFrontClosesAfterShortAnswersAndLargeUnreadBodies(t *testing.T) {
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Case") == "short" {
			w.Header().Set("Content-Length", "10")
			_, _ = w.Write([]byte("abc"))
			return
		}
		http.Error(w, "unauthorized", http.StatusUnauthorized) // the body left unread
	})
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}", "X-Case: short")+rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); string(b) != "abc" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short answer: %q, %v; want abc and the connection closed (%v)", b, err, io.ErrUnexpectedEOF)
	}

	c, br = fs.dial(t)
	big := strings.Repeat("b", maxDiscard+1)
	go func() { _, _ = io.WriteString(c, rawPost("/generate", big)) }()
	resp, body := readAnswer(t, br)
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("answer with %d bytes of body unread: %d %q, Connection: close %v; want 401 and close", len(big), resp.StatusCode, body, resp.Close)
	}
}

// No head timeout means none, as in net/http, not an instant one.
func TestFrontWithoutAHeadTimeout(t *testing.T) {
	fs := startFront(t, 0, time.Minute, echo)
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != "{}" {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
}

// A stream that CloseFront cuts does not end as if it were complete: no
// chunked terminator reaches the client.
func TestCloseFrontLeavesACutStreamIncomplete(t *testing.T) {
	started := make(chan struct{})
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	})
	c, br := fs.dial(t)
	if _, err := io.WriteString(c, rawPost("/generate", "{}")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	fs.ln.CloseFront()
	if b, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("the cut stream ended cleanly after %q", b)
	}
}

// TestFrontHeadFieldsAsNetHTTP sends each answer's request once to the
// front and once to net/http (a query sends it there) and compares the
// heads: the same fields, values and framing, a handler's odd fields
// included (line breaks in values, invalid names, empty and repeated
// values, its own framing fields, answers without a body, a status with
// no name).
func TestFrontHeadFieldsAsNetHTTP(t *testing.T) {
	cases := map[string]func(h http.Header){
		"plain":          func(h http.Header) { h.Set("Content-Type", "application/json") },
		"sniffed":        func(http.Header) {},
		"repeated":       func(h http.Header) { h.Add("X-Multi", "a"); h.Add("X-Multi", "b") },
		"line-breaks":    func(h http.Header) { h["X-Injected"] = []string{"a\r\nSet-Cookie: x=1", " padded\t"} },
		"invalid-name":   func(h http.Header) { h["Bad Name"] = []string{"v"}; h["x-lower"] = []string{"kept"} },
		"empty-type":     func(h http.Header) { h["Content-Type"] = nil },
		"encoded":        func(h http.Header) { h.Set("Content-Encoding", "gzip") },
		"own-date":       func(h http.Header) { h.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT") },
		"keep-alive":     func(h http.Header) { h.Set("Connection", "keep-alive") },
		"bad-length":     func(h http.Header) { h.Set("Content-Length", "abc") },
		"length":         func(h http.Header) { h.Set("Content-Length", "5") },
		"own-chunked":    func(h http.Header) { h.Set("Transfer-Encoding", "chunked") },
		"connection-all": func(h http.Header) { h.Add("Connection", "keep-alive"); h.Add("Connection", "Upgrade") },
		"no-content":     func(h http.Header) { h.Set("Content-Length", "5"); h.Set("Content-Type", "text/plain") },
		"not-modified":   func(h http.Header) { h.Set("Content-Length", "5"); h.Set("Content-Type", "text/plain") },
	}
	cases["unnamed-status"] = func(http.Header) {}
	statuses := map[string]int{"no-content": http.StatusNoContent, "not-modified": http.StatusNotModified, "unnamed-status": 599}
	fs := startFront(t, 5*time.Second, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		name := r.Header.Get("X-Case")
		cases[name](w.Header())
		if code, ok := statuses[name]; ok {
			w.WriteHeader(code)
		}
		_, _ = w.Write([]byte("hello"))
	})
	answer := func(t *testing.T, name, target string) (*http.Response, string) {
		c, br := fs.dial(t)
		if _, err := io.WriteString(c, rawPost(target, "{}", "X-Case: "+name)); err != nil {
			t.Fatal(err)
		}
		return readAnswer(t, br)
	}
	for name := range cases {
		t.Run(name, func(t *testing.T) {
			before := fs.byNetHTP.Load()
			front, frontBody := answer(t, name, "/generate")
			if fs.byNetHTP.Load() != before {
				t.Fatal("the plain request went to net/http")
			}
			std, stdBody := answer(t, name, "/generate?to=net-http")
			if fs.byNetHTP.Load() != before+1 {
				t.Fatal("the request with a query did not go to net/http")
			}
			for _, r := range []*http.Response{front, std} {
				if r.Header.Get("Date") == "" {
					t.Errorf("no Date in %v", r.Header)
				}
			}
			if name != "own-date" {
				front.Header.Del("Date")
				std.Header.Del("Date")
			}
			if !reflect.DeepEqual(front.Header, std.Header) || front.Status != std.Status || frontBody != stdBody ||
				front.ContentLength != std.ContentLength || !slices.Equal(front.TransferEncoding, std.TransferEncoding) || front.Close != std.Close {
				t.Errorf("front: %s %v length %d %v close %v %q\nnet/http: %s %v length %d %v close %v %q",
					front.Status, front.Header, front.ContentLength, front.TransferEncoding, front.Close, frontBody,
					std.Status, std.Header, std.ContentLength, std.TransferEncoding, std.Close, stdBody)
			}
		})
	}
}
