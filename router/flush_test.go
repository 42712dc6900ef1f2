package router_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// countingListener counts the writes to the connections it accepts: the
// system calls a client's answer costs the router.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, writes: l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// specs returns the specs of a pair of sims, for tests that put a fake
// engine at one's URL.
func specs(t *testing.T, p, d *sim.Sim) (pspec, dspec registry.PeerSpec) {
	t.Helper()
	pspec, err := p.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if dspec, err = d.Spec(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pspec, dspec
}

// fakeEngine serves every request on a raw connection with answer: the
// prefill's answer, or a decode's head and its first writes; then, when
// rest is set, it waits for it and writes what it brings.
func fakeEngine(t *testing.T, answer []string, rest <-chan string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					for _, a := range answer {
						if _, err := c.Write([]byte(a)); err != nil {
							return
						}
					}
					if rest != nil {
						if _, err := c.Write([]byte(<-rest)); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return "http://" + l.Addr().String()
}

// sseChunk is one SSE event as one chunk of a chunked answer.
func sseChunk(text string) string {
	ev := `data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"` + text + `"}]}` + "\n\n"
	return strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n"
}

// sseHead is a streamed answer's head as SGLang's and vLLM's server writes
// it (uvicorn 0.54.0 serving a Starlette StreamingResponse, captured: the
// UvicornStream conformance case); sseChunk frames an event as uvicorn does,
// one chunk an event, and the answer ends with the last chunk, no trailers.
const sseHead = "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 18:57:51 GMT\r\nserver: uvicorn\r\n" +
	"content-type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"

// flushFleet is a router in front of a fake SGLang prefill (a whole answer
// at once) and a fake decode, served through a listener that counts the
// writes to its clients; body is a streamed completion request for the
// decode's model.
func flushFleet(t *testing.T, decode []string, rest <-chan string) (b *bundle, body string, writes *atomic.Int64) {
	t.Helper()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	pspec, dspec := specs(t, p, d)
	pspec.URL = fakeEngine(t, []string{"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"}, nil)
	dspec.URL = fakeEngine(t, decode, rest)
	// A clock that moves 150 ms at every reading, as a relay stalled on a
	// loaded machine sees it: every read looks slow (slowStreamWait). A
	// stream whose bytes have all arrived must still not be taken over,
	// which writes chunk by chunk.
	var ticks atomic.Int64
	start := time.Now()
	b = setup(t, router.Config{MaxAttempts: 1, Now: func() time.Time {
		return start.Add(time.Duration(ticks.Add(1)) * 150 * time.Millisecond)
	}}, registry.Peer{PeerSpec: pspec}, registry.Peer{PeerSpec: dspec})
	// The bundle's server again, its listener counting (setup closes
	// whichever b.srv is there at the end).
	b.srv.Close()
	writes = &atomic.Int64{}
	b.srv = httptest.NewUnstartedServer(b.rt.Routes())
	b.srv.Listener = httpwire.NewListener(countingListener{Listener: b.srv.Listener, writes: writes}, time.Minute)
	b.srv.Start()
	return b, `{"model":"` + dspec.Model + `","prompt":"hi","stream":true}`, writes
}

// A stream whose whole answer the decode has sent by the time the router
// reads it goes to the client in one write: its events, and net/http's
// terminator with them. A flush after the first event, or before the end
// that has already arrived, would each cost the router a system call per
// request (and its client a read).
func TestStreamAlreadyArrivedLeavesInOneWrite(t *testing.T) {
	answer := sseHead + sseChunk("a") + sseChunk("b") + sseChunk("c") + "0\r\n\r\n"
	b, req, writes := flushFleet(t, []string{answer}, nil)
	for i := range 3 {
		before := writes.Load()
		resp, body := b.post(t, "/v1/completions", req)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if n := strings.Count(string(body), "data: "); n != 3 {
			t.Fatalf("request %d: %d events relayed, want 3:\n%s", i, n, body)
		}
		if got := writes.Load() - before; got != 1 {
			t.Errorf("request %d: the answer took %d writes to the client, want 1", i, got)
		}
	}
}

// The first event is not held for the rest: while the decode has sent only
// it, the client has it.
func TestStreamFirstEventIsNotHeldForTheRest(t *testing.T) {
	rest := make(chan string, 1)
	b, req, _ := flushFleet(t, []string{sseHead + sseChunk("a")}, rest)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp := b.send(t, ctx, "/v1/completions", req)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, `"text":"a"`) {
		t.Fatalf("first line %q, %v: want the first event while the decode holds the rest", line, err)
	}
	rest <- sseChunk("b") + "0\r\n\r\n"
	tail, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(tail), `"text":"b"`) {
		t.Fatalf("rest %q, %v: want the second event", tail, err)
	}
}
