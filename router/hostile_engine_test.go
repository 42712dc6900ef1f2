package router_test

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestPrefillDeclaringTheLargestLengthFailsOnlyItsRequest: a prefill whose
// answer declares Content-Length 2^63-1 (a valid number, RFC 9110 §8.6)
// and then closes after two bytes. The router reads a prefill's answer
// into a buffer sized from its length; the length must not overflow that
// size. The request fails as a cut answer (502) and the router serves on:
// the prefill leg runs on a goroutine of its own, where a panic would end
// the process.
func TestPrefillDeclaringTheLargestLengthFailsOnlyItsRequest(t *testing.T) {
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	// A fake prefill: an HTTP server that answers every request so.
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
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775807\r\n\r\n{}"))
				}
			}()
		}
	}()
	pspec, dspec := specs(t, p, d)
	pspec.URL = "http://" + l.Addr().String()
	b := setup(t, router.Config{MaxAttempts: 1}, registry.Peer{PeerSpec: pspec}, registry.Peer{PeerSpec: dspec})
	for range 2 {
		resp, body := b.post(t, "/generate", `{"text":"hi","sampling_params":{"max_new_tokens":3}}`)
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d (%s), want 502 for a cut prefill answer", resp.StatusCode, body)
		}
	}
}

// TestDecodeGarbageMidStreamIsCutCleanly: a vLLM decode whose stream turns
// to bytes that are not server-sent events after two good events (a
// broken engine, a proxy's error page written into the connection). The
// client gets the two events, then the router's error event, and none of
// the garbage; the request counts as a stream error, not as ok.
func TestDecodeGarbageMidStreamIsCutCleanly(t *testing.T) {
	p, d := simtest.Pair(t, registry.EngineVLLM, nil)
	// A fake decode (fakeEngine): two good events, then a proxy's error
	// page and an event after it, each a chunk as uvicorn frames them.
	const good = "data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n" +
		"data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"b\"}]}\n\n"
	chunk := func(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }
	decode := fakeEngine(t, []string{sseHead + chunk(good) + chunk("<html><body>502 Bad Gateway</body></html>\n") +
		chunk("data: {\"after\":\"the garbage\"}\n\n") + "0\r\n\r\n"}, nil)
	pspec, dspec := specs(t, p, d)
	dspec.URL = decode
	b := setup(t, router.Config{}, registry.Peer{PeerSpec: pspec}, registry.Peer{PeerSpec: dspec})
	resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":3,"stream":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d (%s): the stream had begun well", resp.StatusCode, body)
	}
	got := string(body)
	if !strings.HasPrefix(got, good) || strings.Contains(got, "html") || strings.Contains(got, "the garbage") ||
		!strings.Contains(got, `"upstream_stream_error"`) {
		t.Fatalf("the client got %q: want the good events, then the router's error event, and no garbage", got)
	}
	if n := b.metric(t, "pdplane_router_requests_total", map[string]string{"route": "completions", "outcome": "stream_error"}); n != 1 {
		t.Fatalf("requests_total{outcome=stream_error} = %v, want 1", n)
	}
}
