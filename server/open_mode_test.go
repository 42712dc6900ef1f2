//go:build linux

package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
)

// serveOpen starts a control plane without tokens, listening on loopback,
// with the router's routes, served as pdplane serve serves it: through the
// router's Listener, its front on or off. It returns the base URL and the
// ID of a registered peer.
func serveOpen(t *testing.T, front bool, allowed ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t))
	store := memstore.New(memstore.Config{})
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rt, err := router.New(router.Config{}, mirror, store, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{Loopback: true, AllowedHosts: allowed},
		server.Deps{Store: store, Snaps: mirror, Registry: reg, Routes: rt}, log)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	ln := httpwire.NewListener(tcp, hs.IdleTimeout)
	if front && !ln.Front(srv.Handler(), hs.ReadHeaderTimeout, rt.Watcher()) {
		t.Fatal("no front on this system")
	}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		_ = hs.Close()
		ln.CloseFront()
	})
	base := "http://" + tcp.Addr().String()
	spec := string(specJSON(registrytest.Spec("d0", registry.RoleDecode)))
	code, _, data := rawTo(t, base, "POST", "/api/v1/peers", spec, "Content-Type", "application/json")
	if code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, data)
	}
	id := data[strings.Index(string(data), `"id":"`)+6:]
	return base, string(id[:36])
}

// rawTo is bundle.raw against base.
func rawTo(t *testing.T, base, method, path, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	return (&bundle{url: base}).raw(t, method, path, body, hdr...)
}

// TestOpenModeRefusesCrossSitePages replays what a page on another origin
// can make a browser send to a control plane without tokens on loopback
// (the finding: a text/plain or form POST to /v1/chat/completions was
// served, spending the local fleet): every route refuses it with 403,
// through the front and through net/http alike, while the same request
// from the server's own origin, from a client that is not a browser, with
// an Authorization header, or as a top-level navigation is served.
func TestOpenModeRefusesCrossSitePages(t *testing.T) {
	t.Parallel()
	for _, front := range []bool{true, false} {
		t.Run(fmt.Sprintf("front=%v", front), func(t *testing.T) {
			t.Parallel()
			base, id := serveOpen(t, front)
			chat := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`
			cross := [][]string{
				{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"},
				{"Origin", "http://evil.example"}, // a browser without Sec-Fetch-*
				{"Sec-Fetch-Site", "cross-site"},
				{"Origin", "null"},
				{"Origin", "http://localhost:3000", "Sec-Fetch-Site", "same-site"}, // another local app
			}
			for _, rq := range []struct{ method, path, body, ctype string }{
				{"POST", "/v1/chat/completions", chat, "text/plain"},
				{"POST", "/v1/chat/completions", "x=1", "application/x-www-form-urlencoded"},
				{"POST", "/v1/completions", `{"model":"sim-model","prompt":"hi"}`, "text/plain"},
				{"POST", "/generate", `{"text":"hi"}`, "text/plain"},
				{"GET", "/v1/models", "", ""},
				{"GET", "/api/v1/peers/" + id + "/registration", "", ""},
				{"GET", "/api/v1/peers", "", ""},
				{"GET", "/metrics", "", ""},
			} {
				for _, h := range cross {
					hdr := append([]string{"Content-Type", rq.ctype}, h...)
					code, _, data := rawTo(t, base, rq.method, rq.path, rq.body, hdr...)
					if code != http.StatusForbidden {
						t.Errorf("%s %s from %v: %d %.200s", rq.method, rq.path, h, code, data)
					}
				}
				// Not refused: a client that is not a browser, the server's
				// own page, and a browser that sends a credential.
				for _, h := range [][]string{nil, {"Origin", base, "Sec-Fetch-Site", "same-origin"}, {"Origin", "http://evil.example", "Authorization", "Bearer any"}} {
					hdr := append([]string{"Content-Type", rq.ctype}, h...)
					if code, _, data := rawTo(t, base, rq.method, rq.path, rq.body, hdr...); code == http.StatusForbidden {
						t.Errorf("%s %s with %v: 403 %.200s", rq.method, rq.path, h, data)
					}
				}
			}
			// A link to the status page from elsewhere still opens it.
			if code, _, data := rawTo(t, base, "GET", "/healthz", "", "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"); code != http.StatusOK {
				t.Errorf("a cross-site navigation: %d %s", code, data)
			}
		})
	}
}

// TestOpenLoopbackServesLoopbackNamesOnly: an open control plane on
// loopback answers a rebound name (the finding: a DNS-rebinding Host read a
// registration with its secret) with 421, through the front and through
// net/http, serves the loopback names with any port, and serves the names
// --allowed-hosts adds.
func TestOpenLoopbackServesLoopbackNamesOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		front   bool
		allowed []string
	}{{true, nil}, {false, nil}, {true, []string{"pdplane.lan"}}, {false, []string{"pdplane.lan"}}} {
		t.Run(fmt.Sprintf("front=%v allowed=%v", c.front, c.allowed), func(t *testing.T) {
			t.Parallel()
			base, id := serveOpen(t, c.front, c.allowed...)
			chat := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`
			lan := http.StatusMisdirectedRequest
			if len(c.allowed) > 0 {
				lan = 0
			}
			for host, want := range map[string]int{
				"rebound.attacker.test:8080": http.StatusMisdirectedRequest,
				"127.0.0.1.attacker.test":    http.StatusMisdirectedRequest,
				"localhost.attacker.test":    http.StatusMisdirectedRequest,
				"localhost:8080":             0,
				"LOCALHOST":                  0,
				"127.0.0.1:1":                0,
				"127.0.0.2:8080":             0,
				"[::1]:8080":                 0,
				"pdplane.lan:8080":           lan,
			} {
				for _, rq := range []struct{ method, path, body string }{
					{"GET", "/api/v1/peers/" + id + "/registration", ""},
					{"POST", "/v1/chat/completions", chat},
				} {
					code, _, data := rawTo(t, base, rq.method, rq.path, rq.body, "Host", host, "Content-Type", "application/json")
					if want != 0 && code != want || want == 0 && code == http.StatusMisdirectedRequest {
						t.Errorf("%s %s with Host %q: %d %.200s", rq.method, rq.path, host, code, data)
					}
				}
			}
		})
	}
}
