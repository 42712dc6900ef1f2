package router_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim/simtest"
)

// series returns the label sets of name's series.
func (b *bundle) series(t *testing.T, name string) []map[string]string {
	t.Helper()
	mfs, err := b.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			out = append(out, ls)
		}
	}
	return out
}

// usageOf reads the token counts of an OpenAI answer or /generate object.
func usageOf(t *testing.T, body []byte) (prompt, completion float64) {
	t.Helper()
	var a struct {
		Usage *struct {
			Prompt     float64 `json:"prompt_tokens"`
			Completion float64 `json:"completion_tokens"`
		} `json:"usage"`
		MetaInfo *struct {
			Prompt     float64 `json:"prompt_tokens"`
			Completion float64 `json:"completion_tokens"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	switch {
	case a.Usage != nil:
		return a.Usage.Prompt, a.Usage.Completion
	case a.MetaInfo != nil:
		return a.MetaInfo.Prompt, a.MetaInfo.Completion
	}
	t.Fatalf("answer without usage: %s", body)
	return 0, 0
}

// lastEventWithUsage is the data of the last SSE event of a stream that
// reports usage, or nil.
func lastEventWithUsage(body []byte) []byte {
	var last []byte
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if ok && (strings.Contains(data, `"usage":{`) || strings.Contains(data, `"meta_info":{`)) {
			last = []byte(data)
		}
	}
	return last
}

// TestTokensAndLatencyPerModelAndRoute: the token counters add what the
// decode's answer reports, a stream only when it reports usage, and every
// dispatched request is timed end to end, with its TTFT, per model and
// route.
func TestTokensAndLatencyPerModelAndRoute(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{"p1": registry.RolePrefill, "d1": registry.RoleDecode})
	b := setupSims(t, router.Config{}, s["p1"], s["d1"])
	const (
		promptC     = "pdplane_router_prompt_tokens_total"
		completionC = "pdplane_router_completion_tokens_total"
	)
	for i, tc := range []struct {
		path, route, body string
		counted           bool
	}{
		{"/v1/chat/completions", "chat_completions", `{"model":"sim-model","messages":[{"role":"user","content":"count my tokens please"}],"max_tokens":4}`, true},
		{"/v1/completions", "completions", `{"model":"sim-model","prompt":"one two three","max_tokens":5,"stream":true}`, false},
		{"/v1/completions", "completions", `{"model":"sim-model","prompt":"one two three","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"/generate", "generate", `{"text":"a prompt for generate","sampling_params":{"max_new_tokens":6}}`, true},
		{"/generate", "generate", `{"text":"a streamed prompt","sampling_params":{"max_new_tokens":3},"stream":true}`, true},
	} {
		labels := map[string]string{"route": tc.route, "model": "sim-model"}
		p0, c0 := b.total(t, promptC, labels), b.total(t, completionC, labels)
		d0, f0 := b.total(t, "pdplane_router_request_duration_seconds", labels), b.total(t, "pdplane_router_ttft_seconds", labels)
		resp, body := b.post(t, tc.path, tc.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		var wantP, wantC float64
		if tc.counted {
			ans := body
			if ev := lastEventWithUsage(body); ev != nil {
				ans = ev
			}
			wantP, wantC = usageOf(t, ans)
			if wantP == 0 || wantC == 0 {
				t.Fatalf("request %d: the answer reports no tokens: %s", i, body)
			}
		}
		if gotP, gotC := b.total(t, promptC, labels)-p0, b.total(t, completionC, labels)-c0; gotP != wantP || gotC != wantC {
			t.Fatalf("request %d (%s): counted %v prompt and %v completion tokens, want %v and %v; answer %s",
				i, tc.route, gotP, gotC, wantP, wantC, body)
		}
		if got := b.total(t, "pdplane_router_request_duration_seconds", labels) - d0; got != 1 {
			t.Fatalf("request %d: request_duration_seconds observed %v times", i, got)
		}
		if got := b.total(t, "pdplane_router_ttft_seconds", labels) - f0; got != 1 {
			t.Fatalf("request %d: ttft_seconds observed %v times", i, got)
		}
	}
	// A request refused before its model is known is not timed under a
	// client's model name.
	if resp, _ := b.post(t, "/v1/completions", `{"model":"no-such-model","prompt":"x"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: %d", resp.StatusCode)
	}
	for _, ls := range b.series(t, "pdplane_router_request_duration_seconds") {
		if ls["model"] != "sim-model" {
			t.Fatalf("request_duration_seconds series %v", ls)
		}
	}
}

// TestPeerSeriesDeletedWhenPeerLeaves: the per-peer series of a peer that
// left the routing snapshot are deleted; the others stay.
func TestPeerSeriesDeletedWhenPeerLeaves(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{
		"p1": registry.RolePrefill, "p2": registry.RolePrefill, "d1": registry.RoleDecode,
	})
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyRoundRobin}, s["p1"], s["p2"], s["d1"])
	const chat = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for range 2 {
		if resp, body := b.post(t, "/v1/chat/completions", chat); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	peersOf := func(name string) map[string]bool {
		out := map[string]bool{}
		for _, ls := range b.series(t, name) {
			out[ls["peer"]] = true
		}
		return out
	}
	for _, name := range []string{"pdplane_router_breaker_state", "pdplane_router_selections_total"} {
		if got := peersOf(name); !got["p1"] || !got["p2"] || !got["d1"] {
			t.Fatalf("%s has series for %v, want p1, p2 and d1", name, got)
		}
	}

	id := b.reg.id(t, "p2")
	if err := b.reg.store.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	simtest.WaitFor(t, "the mirror to drop p2", func() bool {
		_, ok := b.reg.mirror.Snapshot().Peer(id)
		return !ok
	})
	// The next request builds the router's view of the new snapshot.
	if resp, body := b.post(t, "/v1/chat/completions", chat); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, name := range []string{"pdplane_router_breaker_state", "pdplane_router_selections_total"} {
		if got := peersOf(name); got["p2"] || !got["p1"] || !got["d1"] {
			t.Fatalf("%s has series for %v after p2 left, want p1 and d1 only", name, got)
		}
	}
}

// TestMetricsLint runs the checks of `promtool check metrics`
// (client_golang's promlint) over the router's and the control plane's
// metrics as a scrape shows them after some traffic.
func TestMetricsLint(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{"p1": registry.RolePrefill, "d1": registry.RoleDecode})
	prom := prometheus.NewRegistry()
	_, srv := controlPlane(t, router.Config{}, prom, zerolog.Nop(), s["p1"], s["d1"])
	h := srv.Handler()
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"sim-model","prompt":"x","max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	problems, err := promlint.New(bytes.NewReader(rec.Body.Bytes())).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{"pdplane_build_info", "pdplane_router_prompt_tokens_total", "pdplane_router_request_duration_seconds_bucket",
		"pdplane_pairs_quarantined", "pdplane_pairs_on_trial", "pdplane_peers_healing"} {
		if !strings.Contains(rec.Body.String(), "\n"+name) {
			t.Errorf("/metrics has no %s", name)
		}
	}
}
