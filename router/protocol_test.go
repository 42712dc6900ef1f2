package router_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// loggedPair starts a simulated prefill and decode of engine that keep the
// requests they receive.
func loggedPair(t *testing.T, engine registry.Engine) (p, d *sim.Sim) {
	t.Helper()
	return simtest.Pair(t, engine, func(c *sim.Config) { c.LogRequests = true })
}

// bodyOf decodes a received body, numbers as json.Number.
func bodyOf(t *testing.T, r sim.Received) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s body %q: %v", r.Path, r.Body, err)
	}
	return m
}

func TestSGLangNonStreamingRoutes(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineSGLang)
	b := setupSims(t, router.Config{}, p, d)
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`, `"object":"chat.completion"`},
		{"/v1/completions", `{"model":"sim-model","prompt":"once upon","max_tokens":3}`, `"object":"text_completion"`},
		{"/generate", `{"text":"once upon","sampling_params":{"max_new_tokens":4}}`, `"meta_info"`},
	} {
		resp, body := b.post(t, tc.path, tc.body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) {
			t.Fatalf("%s: %d %s", tc.path, resp.StatusCode, body)
		}
		if resp.Header.Get("X-Request-Id") == "" {
			t.Fatalf("%s: no X-Request-Id", tc.path)
		}
	}
	// The generated request ID is on both legs.
	pr, dr := p.Received(), d.Received()
	if len(pr) != 3 || len(dr) != 3 {
		t.Fatalf("prefill got %d requests, decode %d", len(pr), len(dr))
	}
	for i := range pr {
		if id := pr[i].Header.Get("X-Request-Id"); id == "" || id != dr[i].Header.Get("X-Request-Id") {
			t.Fatalf("request %d: prefill id %q, decode id %q", i, id, dr[i].Header.Get("X-Request-Id"))
		}
	}
}

func TestVLLMProtocol(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineVLLM)
	b := setupSims(t, router.Config{}, p, d)

	sresp := b.send(t, context.Background(), "/v1/chat/completions",
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":3,"min_tokens":2}`)
	defer sresp.Body.Close()
	sr := &sseReader{bufio.NewReader(sresp.Body)}
	var chunks []string
	for c := sr.next(t); c != "[DONE]"; c = sr.next(t) {
		chunks = append(chunks, c)
	}
	if len(chunks) != 4 || !strings.Contains(chunks[0], "chat.completion.chunk") || !strings.Contains(chunks[3], `"usage"`) {
		t.Fatalf("chunks %q", chunks)
	}

	resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"once","max_tokens":5}`, "X-Request-Id", "rid-v")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"object":"text_completion"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	pr, dr := p.Received(), d.Received()
	if len(pr) != 2 || len(dr) != 2 {
		t.Fatalf("prefill %d, decode %d requests", len(pr), len(dr))
	}
	// The prefill got one unstreamed token; the decode got the client's
	// stream settings and the prefill's kv_transfer_params; both legs
	// shared an ID.
	if pb := bodyOf(t, pr[0]); pb["stream"] != false || pb["stream_options"] != nil || pb["max_tokens"] != json.Number("1") {
		t.Fatalf("prefill body %s", pr[0].Body)
	}
	db := bodyOf(t, dr[0])
	if db["stream"] != true || db["stream_options"] == nil || db["min_tokens"] == nil {
		t.Fatalf("decode body %s", dr[0].Body)
	}
	kv, _ := db["kv_transfer_params"].(map[string]any)
	if id, _ := kv["remote_engine_id"].(string); id == "" || kv["do_remote_prefill"] != true {
		t.Fatalf("decode kv_transfer_params %v", kv)
	}
	for i := range pr {
		if id := pr[i].Header.Get("X-Request-Id"); id == "" || id != dr[i].Header.Get("X-Request-Id") {
			t.Fatalf("request %d: ids %q and %q", i, id, dr[i].Header.Get("X-Request-Id"))
		}
	}
	if pr[1].Header.Get("X-Request-Id") != "rid-v" {
		t.Fatalf("client id not kept: %q", pr[1].Header.Get("X-Request-Id"))
	}

	// vLLM has no native /generate.
	resp, body = b.post(t, "/generate", `{"text":"x"}`)
	if resp.StatusCode != http.StatusBadRequest || decodeError(t, body).Error.Code == nil {
		t.Fatalf("/generate on vLLM: %d %s", resp.StatusCode, body)
	}
}

func TestModelResolutionAndMissingRoles(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineSGLang)
	oc := simtest.Config("o1", registry.RoleDecode, registry.EngineSGLang)
	oc.Model = "other-model"
	other := simtest.Start(t, oc)
	b := setupSims(t, router.Config{}, p, d)

	// One model served: a request without one uses it.
	resp, body := b.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if got := bodyOf(t, d.Received()[0])["model"]; got != sim.DefaultModel {
		t.Fatalf("upstream model %v", got)
	}

	// Two models: the model is required; the second has no prefill.
	spec, err := other.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.reg.register(t, spec)
	resp, body = b.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if e := decodeError(t, body); resp.StatusCode != 400 || *e.Error.Code != "model_required" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = b.post(t, "/v1/chat/completions", `{"model":"other-model","messages":[{"role":"user","content":"hi"}]}`)
	if e := decodeError(t, body); resp.StatusCode != 503 || !strings.Contains(e.Error.Message, "no ready prefill") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// The decode goes stale: no ready decode.
	b.reg.markStale(t, "d0")
	resp, body = b.post(t, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
	if e := decodeError(t, body); resp.StatusCode != 503 || !strings.Contains(e.Error.Message, "no ready decode") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// Incompatible geometry: no compatible pair. (The decode's agent
	// re-registers it with fresh agents and another page size.)
	bad := b.reg.peer(t, "d0").PeerSpec
	bad.KV.PageSize *= 4
	bad.Ranks = []registry.Rank{bad.Ranks[0]}
	bad.Ranks[0].AgentName += "-restarted"
	b.reg.register(t, bad)
	resp, body = b.post(t, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
	if e := decodeError(t, body); resp.StatusCode != 503 || !strings.Contains(e.Error.Message, "compatible") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := len(d.Received()); n != 1 {
		t.Fatalf("decode got %d requests", n)
	}
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineSGLang)
	b := setupSims(t, router.Config{APIKeys: []string{"k1", "k2"}, UpstreamAPIKey: "engine-key"}, p, d)
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for _, h := range [][]string{nil, {"Authorization", "Bearer nope"}, {"Authorization", "k1"}} {
		resp, out := b.post(t, "/v1/chat/completions", body, h...)
		if e := decodeError(t, out); resp.StatusCode != 401 || *e.Error.Code != "invalid_api_key" {
			t.Fatalf("%v: %d %s", h, resp.StatusCode, out)
		}
	}
	resp, out := b.post(t, "/v1/chat/completions", body, "Authorization", "Bearer k2")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	for _, r := range append(p.Received(), d.Received()...) {
		if got := r.Header.Get("Authorization"); got != "Bearer engine-key" {
			t.Fatalf("engine got Authorization %q", got)
		}
	}
	if n := len(d.Received()); n != 1 {
		t.Fatalf("decode got %d requests", n)
	}
	// /v1/models is behind the keys; /health is not.
	r, err := http.Get(b.srv.URL + "/v1/models")
	if err != nil || r.StatusCode != 401 {
		t.Fatalf("/v1/models without key: %v %v", r.StatusCode, err)
	}
	r.Body.Close()
	r, err = http.Get(b.srv.URL + "/health")
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("/health: %v %v", r.StatusCode, err)
	}
	r.Body.Close()
}

// TestUpstreamClientErrorIsPassedOn: an engine's 400 (here, max_tokens over
// the engine's limit) reaches the client as it is and is not retried.
func TestUpstreamClientErrorIsPassedOn(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{}, p, d)
	resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":999999}`)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "max_tokens") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := d.Stats().Requests; n != 1 {
		t.Fatalf("a client error was retried: %d attempts", n)
	}
}
