package router_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
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
	pspec, err := p.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dspec, err := d.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pspec.URL = "http://" + l.Addr().String()
	b := setup(t, router.Config{MaxAttempts: 1}, registry.Peer{PeerSpec: pspec}, registry.Peer{PeerSpec: dspec})
	for range 2 {
		resp, body := b.post(t, "/generate", `{"text":"hi","sampling_params":{"max_new_tokens":3}}`)
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d (%s), want 502 for a cut prefill answer", resp.StatusCode, body)
		}
	}
}
