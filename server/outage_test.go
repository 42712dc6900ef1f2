package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestStoreOutageAnswers503 cuts a replica off its PostgreSQL (a real
// outage, through registrytest.Outage) and calls every endpoint that needs
// the store: each answers 503 problem+json with Retry-After, never 500, so
// that agents retry or fail over to another replica. Readiness stays 200
// while the routing snapshot has a pair: the router keeps routing from it.
func TestStoreOutageAnswers503(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t))
	store, outage, _ := registrytest.NewPGStoreWithOutage(t, pgstore.Config{})
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{AdminToken: adminToken, JoinTokens: []string{joinToken}},
		server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	b := &bundle{url: ts.URL, store: store, mirror: mirror, creds: map[string]string{}, ids: map[string]string{}}
	pf, dc := registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode)
	var ids []string
	for _, s := range []registry.PeerSpec{pf, dc} {
		p := b.register(t, s)
		ids = append(ids, p["id"].(string))
		b.heartbeat(t, p["id"].(string), s.InstanceID)
	}
	simtest.WaitFor(t, "a routable pair in the snapshot", func() bool { ok, _ := mirror.Snapshot().Routable(); return ok })

	outage.Cut()
	for _, tc := range []struct {
		method, path, token string
		body                any
	}{
		{"POST", "/api/v1/peers", joinToken, registrytest.Spec("d1", registry.RoleDecode)},
		{"POST", "/api/v1/peers/" + ids[1] + "/heartbeat", adminToken, map[string]any{"instance_id": dc.InstanceID}},
		{"GET", "/api/v1/peers", "", nil},
		{"GET", "/api/v1/peers/" + ids[1], "", nil},
		{"POST", "/api/v1/peers/" + ids[1] + "/stale", adminToken, map[string]any{"reason": "test"}},
		{"POST", "/api/v1/peers/" + ids[1] + "/stale", adminToken, map[string]any{"reason": "test", "prefill_id": ids[0], "agent_name": "d0-agent-0"}},
		{"POST", "/api/v1/peers/" + ids[1] + "/drain", adminToken, nil},
		{"DELETE", "/api/v1/peers/" + ids[1], adminToken, nil},
		{"GET", "/api/v1/events", "", nil},
		{"GET", "/api/v1/events/stream", "", nil},
		// A credential the snapshot does not know can be checked only in
		// the store: unknown now, not refused.
		{"POST", "/api/v1/peers/00000000-0000-4000-8000-000000000000/heartbeat",
			"pdpc.00000000-0000-4000-8000-000000000000." + strings.Repeat("A", 43), map[string]any{"instance_id": "i"}},
	} {
		code, out, h := b.do(t, tc.method, tc.path, tc.token, tc.body)
		if code != http.StatusServiceUnavailable || out["type"] != server.ProblemUnavailable ||
			!strings.HasPrefix(h.Get("Content-Type"), "application/problem+json") || h.Get("Retry-After") != "1" {
			t.Errorf("%s %s during the outage: %d %v (Retry-After %q), want 503 %s with Retry-After",
				tc.method, tc.path, code, out, h.Get("Retry-After"), server.ProblemUnavailable)
		}
		if detail, _ := out["detail"].(string); strings.Contains(detail, "127.0.0.1") || strings.Contains(detail, "EOF") {
			t.Errorf("%s %s: the 503 echoes the cause: %q", tc.method, tc.path, detail)
		}
	}
	resp, err := http.Get(ts.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "store") {
		t.Errorf("readyz during the outage with a routable snapshot: %d %q, want 200 naming the store", resp.StatusCode, body)
	}
	if code, out, _ := b.do(t, "GET", "/api/v1/pairs", "", nil); code != http.StatusOK || out["total"] != 1.0 {
		t.Errorf("pairs during the outage: %d %v; they come from the snapshot and must still answer", code, out)
	}
	if ok, reason := mirror.Snapshot().Routable(); !ok {
		t.Errorf("the snapshot lost its pair during the outage: %s", reason)
	}

	outage.Restore()
	simtest.WaitFor(t, "the API answering again", func() bool {
		code, _, _ := b.do(t, "GET", "/api/v1/peers", "", nil)
		return code == http.StatusOK
	})
	b.heartbeat(t, ids[1], dc.InstanceID)
}
