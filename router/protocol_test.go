package router_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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
	// vLLM's role chunk, three tokens, the usage chunk.
	if len(chunks) != 5 || !strings.Contains(chunks[0], "chat.completion.chunk") || !strings.Contains(chunks[4], `"usage"`) {
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
	b.reg.registerSim(t, other)
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
	// Both legs get the request at once; whichever refuses first cancels
	// the other, which may then never count it. A retry would reach a leg
	// a second time.
	if np, nd := p.Stats().Requests, d.Stats().Requests; np > 1 || nd > 1 || np+nd == 0 {
		t.Fatalf("a client error was retried or never sent: prefill saw %d requests, decode %d", np, nd)
	}
}

// TestSGLangStreamsChunksAsTheyArrive: the client reads the first chunk
// while the decode is still generating (the router relays, it does not
// buffer), and both legs got the same body with the prefill's bootstrap
// address, one room, and the client's request ID.
func TestSGLangStreamsChunksAsTheyArrive(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) {
		c.LogRequests = true
		c.DecodeTimePerToken = 10 * time.Millisecond
	})
	b := setupSims(t, router.Config{}, p, d)

	resp := b.send(t, context.Background(), "/v1/chat/completions",
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":200,"stream":true}`, "X-Request-Id", "client-rid-1")
	// Closed at the end: the router records its outcome just after the
	// last byte, and a client that leaves first is a client gone.
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sr := &sseReader{bufio.NewReader(resp.Body)}
	if first := sr.next(t); !strings.Contains(first, "chat.completion.chunk") {
		t.Fatalf("first chunk %s", first)
	}
	// 200 tokens at 10 ms: the decode has about two seconds of work left.
	if n := d.Load().Running; n != 1 {
		t.Fatalf("the client saw its first chunk only after the decode finished (running %d)", n)
	}
	n := 1
	for c := sr.next(t); c != "[DONE]"; c = sr.next(t) {
		n++
	}
	if n != 200 {
		t.Fatalf("%d chunks for 200 tokens", n)
	}

	pr, dr := p.Received(), d.Received()
	if len(pr) != 1 || len(dr) != 1 {
		t.Fatalf("prefill got %d requests, decode %d", len(pr), len(dr))
	}
	if !bytes.Equal(pr[0].Body, dr[0].Body) {
		t.Fatalf("legs got different bodies:\n%s\n%s", pr[0].Body, dr[0].Body)
	}
	bs := bodyOf(t, pr[0])
	if bs["bootstrap_host"] != "127.0.0.1" || bs["bootstrap_port"] != json.Number(strconv.Itoa(p.BootstrapPort())) || bs["bootstrap_room"] == nil {
		t.Fatalf("bootstrap %v %v %v", bs["bootstrap_host"], bs["bootstrap_port"], bs["bootstrap_room"])
	}
	for _, r := range append(pr, dr...) {
		if r.Header.Get("X-Request-Id") != "client-rid-1" {
			t.Fatalf("leg %s has X-Request-Id %q", r.Path, r.Header.Get("X-Request-Id"))
		}
	}
	if resp.Header.Get("X-Request-Id") != "client-rid-1" {
		t.Fatalf("answer X-Request-Id %q", resp.Header.Get("X-Request-Id"))
	}
	// The handler records its metrics as it returns, which may be just after
	// the client has read the last byte.
	b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"route": "chat_completions", "outcome": "ok"}, 1)
	b.waitMetric(t, "pdplane_router_ttft_seconds", nil, 1)
}

// TestSGLangBatchBootstrapLists: a batch carries the bootstrap triple as
// lists, one entry per prompt, all naming the prefill, with distinct rooms;
// a single prompt carries scalars. (The simulator samples one sequence per
// prompt and refuses n > 1; TestParseRequest covers the batch × n sizes.)
func TestSGLangBatchBootstrapLists(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineSGLang)
	b := setupSims(t, router.Config{}, p, d)
	port := json.Number(strconv.Itoa(p.BootstrapPort()))
	for _, tc := range []struct {
		path, body string
		want       int
	}{
		{"/generate", `{"text":["a","b","c"],"sampling_params":{"max_new_tokens":2}}`, 3},
		{"/generate", `{"input_ids":[[1,2],[3]],"sampling_params":{"max_new_tokens":2}}`, 2},
		{"/v1/completions", `{"model":"sim-model","prompt":["a","b"],"max_tokens":2}`, 2},
		{"/v1/completions", `{"model":"sim-model","prompt":[1,2,3],"max_tokens":2}`, 0},
	} {
		resp, body := b.post(t, tc.path, tc.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, body)
		}
		reqs := d.Received()
		m := bodyOf(t, reqs[len(reqs)-1])
		hosts, isList := m["bootstrap_host"].([]any)
		if tc.want == 0 {
			if isList || m["bootstrap_host"] != "127.0.0.1" || m["bootstrap_port"] != port {
				t.Fatalf("%s: bootstrap %v:%v for a single prompt", tc.body, m["bootstrap_host"], m["bootstrap_port"])
			}
			continue
		}
		ports, _ := m["bootstrap_port"].([]any)
		rooms, _ := m["bootstrap_room"].([]any)
		if !isList || len(hosts) != tc.want || len(ports) != tc.want || len(rooms) != tc.want {
			t.Fatalf("%s: bootstrap %v %v %v, want %d entries", tc.body, hosts, ports, rooms, tc.want)
		}
		seen := map[any]bool{}
		for i := range hosts {
			if hosts[i] != "127.0.0.1" || ports[i] != port || seen[rooms[i]] {
				t.Fatalf("%s: entry %d is %v:%v room %v", tc.body, i, hosts[i], ports[i], rooms[i])
			}
			seen[rooms[i]] = true
		}
	}
}

// TestSGLangLogprobMerge: a decode reports no logprobs for the prompt (the
// prefill computed it), so the router puts the prefill's
// input_token_logprobs in front of the decode's answer: one per prompt
// token, in a single answer, per batch element, and in a stream's first
// event.
func TestSGLangLogprobMerge(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{}, p, d)
	type meta struct {
		MetaInfo struct {
			In           []json.RawMessage `json:"input_token_logprobs"`
			PromptTokens int               `json:"prompt_tokens"`
		} `json:"meta_info"`
	}
	check := func(what string, m meta) {
		t.Helper()
		if m.MetaInfo.PromptTokens == 0 || len(m.MetaInfo.In) != m.MetaInfo.PromptTokens {
			t.Fatalf("%s: %d input logprobs for %d prompt tokens", what, len(m.MetaInfo.In), m.MetaInfo.PromptTokens)
		}
	}

	resp, body := b.post(t, "/generate", `{"text":"hello there","return_logprob":true,"sampling_params":{"max_new_tokens":2}}`)
	var one meta
	if err := json.Unmarshal(body, &one); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	check("single", one)

	// Batches merge element-wise.
	resp, body = b.post(t, "/generate", `{"text":["a","b c d"],"return_logprob":true,"sampling_params":{"max_new_tokens":2}}`)
	var batch []meta
	if err := json.Unmarshal(body, &batch); err != nil || resp.StatusCode != http.StatusOK || len(batch) != 2 {
		t.Fatalf("batch: %d %s", resp.StatusCode, body)
	}
	check("batch[0]", batch[0])
	check("batch[1]", batch[1])

	// Streaming: the first event carries the prompt's logprobs.
	sresp := b.send(t, context.Background(), "/generate", `{"text":"hello there","return_logprob":true,"stream":true,"sampling_params":{"max_new_tokens":2}}`)
	defer sresp.Body.Close()
	sr := &sseReader{bufio.NewReader(sresp.Body)}
	var first meta
	if err := json.Unmarshal([]byte(sr.next(t)), &first); err != nil {
		t.Fatal(err)
	}
	check("stream", first)
}
