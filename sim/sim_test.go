package sim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// *Sim is what the host agent registers.
var _ agent.Engine = (*sim.Sim)(nil)

func TestMain(m *testing.M) {
	transfertest.UseLoopbackUCX()
	os.Exit(m.Run())
}

func chatBody(content string, maxTokens int, stream bool) map[string]any {
	m := map[string]any{
		"model":    "sim-model",
		"messages": []any{map[string]any{"role": "user", "content": content}},
		"stream":   stream,
	}
	if maxTokens > 0 {
		m["max_tokens"] = maxTokens
	}
	return m
}

// chatAnswer is the part of a chat completion the tests read.
type chatAnswer struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

func decodeAnswer(t *testing.T, r simtest.Response) chatAnswer {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	var a chatAnswer
	if err := json.Unmarshal(r.Body, &a); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
	if len(a.Choices) == 0 {
		t.Fatalf("no choices: %s", r.Body)
	}
	return a
}

// timedEvent is one SSE data payload and when it arrived.
type timedEvent struct {
	at   time.Time
	data []byte
}

// stream posts body and reads the SSE answer event by event.
func stream(ctx context.Context, url, path string, body any, header http.Header) (int, []timedEvent, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header = header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var evs []timedEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			evs = append(evs, timedEvent{at: time.Now(), data: []byte(d)})
		}
	}
	return resp.StatusCode, evs, sc.Err()
}

// pdOK runs one PD request the way p's engine kind does (SGLang: prefill
// and decode at once under a fresh room; vLLM: prefill, then decode with
// its kv_transfer_params) and checks both answers are 200.
func pdOK(t *testing.T, p, d *sim.Sim, path string, body map[string]any) (pr, dr simtest.Response) {
	t.Helper()
	c, ctx := simtest.NewClient(), context.Background()
	var err error
	if p.Config().Engine == registry.EngineVLLM {
		pr, dr, err = c.VLLM(ctx, p, d, path, body)
	} else {
		pr, dr, err = c.SGLang(ctx, p, d, path, body, simtest.Room())
	}
	if err != nil {
		t.Fatal(err)
	}
	if pr.Status != http.StatusOK || dr.Status != http.StatusOK {
		t.Fatalf("prefill %d %s\ndecode %d %s", pr.Status, pr.Body, dr.Status, dr.Body)
	}
	return pr, dr
}

func testLog(t testing.TB) zerolog.Logger { return zerolog.New(zerolog.NewTestWriter(t)) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	simtest.WaitFor(t, what, cond)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	base := simtest.Config("x", registry.RolePrefill, registry.EngineSGLang)
	for _, tt := range []struct {
		name  string
		edit  func(*sim.Config)
		field string
	}{
		{"no name", func(c *sim.Config) { c.Name = "" }, "name"},
		{"role both", func(c *sim.Config) { c.Role = registry.RoleBoth }, "role"},
		{"engine sim", func(c *sim.Config) { c.Engine = "sim" }, "engine"},
		{"transfer", func(c *sim.Config) { c.Transfer = "rdma" }, "transfer"},
		{"dtype", func(c *sim.Config) { c.DType = "int4" }, "dtype"},
		{"pages", func(c *sim.Config) { c.Pages = -1 }, "pages"},
		{"bootstrap port", func(c *sim.Config) { c.BootstrapPort = 70000 }, "bootstrap_port"},
		{"addr", func(c *sim.Config) { c.Addr = "nowhere" }, "addr"},
		{"huge pool", func(c *sim.Config) { c.Pages = 1 << 30 }, "pages"},
		// Each factor alone fits; their product wraps around int64 to 0.
		{"overflowing geometry", func(c *sim.Config) { c.PageSize, c.NumKVHeads, c.HeadDim = 1<<21, 1<<21, 1<<21 }, "pages"},
		{"head dim", func(c *sim.Config) { c.HeadDim = -1 }, "head_dim"},
		{"prefill slots", func(c *sim.Config) { c.PrefillSlots = -1 }, "prefill_slots"},
		{"prefix cache above the pool", func(c *sim.Config) { c.Pages, c.PrefixCachePages = 8, 9 }, "prefix_cache_pages"},
		{"negative prefix cache", func(c *sim.Config) { c.PrefixCachePages = -1 }, "prefix_cache_pages"},
		{"KV events address", func(c *sim.Config) { c.KVEventsAddr = "nowhere" }, "kv_events_addr"},
		{"KV events on a decode", func(c *sim.Config) { c.Role, c.KVEventsAddr = registry.RoleDecode, "127.0.0.1:0" }, "kv_events_addr"},
		{"a replay without events", func(c *sim.Config) { c.KVEventsReplayAddr = "127.0.0.1:0" }, "kv_events_replay_addr"},
		{"KV events replay address", func(c *sim.Config) { c.KVEventsAddr, c.KVEventsReplayAddr = "127.0.0.1:0", "x" }, "kv_events_replay_addr"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := base
			tt.edit(&c)
			_, err := sim.New(c, testLog(t))
			if err == nil || !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("got %v, want an error naming %s", err, tt.field)
			}
		})
	}
}

func TestSpecAndReregister(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	ctx := context.Background()
	ps, err := p.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := d.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []registry.PeerSpec{ps, ds} {
		s = s.WithDefaults()
		if err := s.Validate(); err != nil {
			t.Fatalf("%s: spec does not validate: %v", s.Name, err)
		}
		if len(s.Ranks) != 1 || len(s.Ranks[0].KVDataPtrs) != 4 || s.Ranks[0].KVItemLens[0] != 4*2*8*2 {
			t.Fatalf("%s: unexpected geometry %+v", s.Name, s.Ranks)
		}
		for _, k := range s.Ranks[0].KVMemKinds {
			if k != registry.DRAM {
				t.Fatalf("%s: kinds %v", s.Name, s.Ranks[0].KVMemKinds)
			}
		}
	}
	if ps.BootstrapPort != p.BootstrapPort() || ps.BootstrapPort == 0 || ds.BootstrapPort != 0 {
		t.Fatalf("bootstrap ports: prefill spec %d (sim %d), decode %d", ps.BootstrapPort, p.BootstrapPort(), ds.BootstrapPort)
	}
	if ps.Engine != registry.EngineSGLang || ps.URL != p.URL() || ps.InstanceID == ds.InstanceID {
		t.Fatalf("identity: %+v", ps)
	}
	pw, dw := ps.WithDefaults(), ds.WithDefaults()
	if v := registry.CheckPair(&pw, &dw); !v.Compatible || v.Path != registry.PathEqualTP {
		t.Fatalf("pair verdict %+v", v)
	}

	if err := d.Reregister(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	ds2, _ := d.Spec(ctx)
	if !registry.NeedsNewGeneration(&ds, &ds2) || ds2.InstanceID != ds.InstanceID {
		t.Fatalf("re-registration kept agent %s", ds2.Ranks[0].AgentName)
	}
	if !strings.HasPrefix(ds2.Ranks[0].AgentName, "d0-g2-") || bytes.Equal(ds2.Ranks[0].AgentMetadata, ds.Ranks[0].AgentMetadata) {
		t.Fatalf("agent %s, metadata unchanged: %t", ds2.Ranks[0].AgentName, bytes.Equal(ds2.Ranks[0].AgentMetadata, ds.Ranks[0].AgentMetadata))
	}
	if d.Generation() != 2 {
		t.Fatalf("generation %d", d.Generation())
	}
	if l := d.Load(); l.Running != 0 || l.Queued != 0 || l.KVUsage != 0 {
		t.Fatalf("idle load %+v", l)
	}
}

func TestInfoEndpoints(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang))
	for _, tt := range []struct{ path, want string }{
		{"/health", ""},
		{"/health_generate", ""},
		{"/v1/models", `"id":"sim-model"`},
		{"/get_model_info", `"model_path":"sim-model"`},
		{"/server_info", `"disaggregation_mode":"prefill"`},
		{"/_sim/stats", `"role":"prefill"`},
		{"/_sim/fault", `"fault":"none"`},
	} {
		resp, err := http.Get(s.URL() + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(buf.String(), tt.want) {
			t.Fatalf("%s: %d %s", tt.path, resp.StatusCode, buf.String())
		}
	}
	resp, err := http.Get(s.URL() + "/server_info")
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if int(info["disaggregation_bootstrap_port"].(float64)) != s.BootstrapPort() {
		t.Fatalf("server_info bootstrap port %v, sim %d", info["disaggregation_bootstrap_port"], s.BootstrapPort())
	}
}

func TestFaultEndpoint(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	c := simtest.NewClient()
	ctx := context.Background()

	for _, tt := range []struct {
		s     *sim.Sim
		fault string
	}{{p, "meltdown"}, {p, "missing-mem-kind"}, {d, "corrupt-kv"}, {d, "recompute"}} { // recompute: vLLM decodes only
		r, err := c.SetFault(ctx, tt.s, tt.fault)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusBadRequest || r.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(r.Body), `"field":"fault"`) {
			t.Fatalf("%s: %d %s %s", tt.fault, r.Status, r.Header.Get("Content-Type"), r.Body)
		}
	}

	// prefill-error: an ordinary 500.
	if r, _ := c.SetFault(ctx, p, "prefill-error"); r.Status != http.StatusOK {
		t.Fatalf("set fault: %d %s", r.Status, r.Body)
	}
	pr, _, err := c.SGLang(ctx, p, d, "/v1/chat/completions", chatBody("hi", 2, false), simtest.Room())
	if err != nil {
		t.Fatal(err)
	}
	if pr.Status != http.StatusInternalServerError || strings.Contains(string(pr.Body), "Missing NIXL") {
		t.Fatalf("prefill-error: %d %s", pr.Status, pr.Body)
	}

	// crash: connections are dropped; none brings it back.
	if r, _ := c.SetFault(ctx, p, "crash"); r.Status != http.StatusOK {
		t.Fatalf("set crash: %d %s", r.Status, r.Body)
	}
	if _, err := http.Get(p.URL() + "/health"); err == nil {
		t.Fatal("a crashed sim answered /health")
	}
	if r, _ := c.SetFault(ctx, p, "none"); r.Status != http.StatusOK {
		t.Fatalf("clear crash: %d %s", r.Status, r.Body)
	}
	pr, dr, err := c.SGLang(ctx, p, d, "/v1/chat/completions", chatBody("hi again", 2, false), simtest.Room())
	if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
		t.Fatalf("after crash: %v %d %s / %d %s", err, pr.Status, pr.Body, dr.Status, dr.Body)
	}

	// slow: a zero per-token time becomes 10ms a token, from the second
	// token on (an SGLang decode's first is the prefill's).
	if r, _ := c.SetFault(ctx, d, "slow"); r.Status != http.StatusOK {
		t.Fatalf("set slow: %d %s", r.Status, r.Body)
	}
	start := time.Now()
	_, dr, err = c.SGLang(ctx, p, d, "/v1/chat/completions", chatBody("slowly", 6, false), simtest.Room())
	if err != nil || dr.Status != http.StatusOK {
		t.Fatalf("slow: %v %d %s", err, dr.Status, dr.Body)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("slow decode took only %s for 6 tokens", el)
	}
}

func TestCrashCutsStream(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, func() sim.Config {
		c := simtest.Config("v0", registry.RoleDecode, registry.EngineVLLM)
		c.DecodeTimePerToken = 20 * time.Millisecond
		return c
	}())
	b, _ := json.Marshal(chatBody("a long answer", 100, true))
	resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: HTTP %d", resp.StatusCode)
	}
	// The crash is set only once the stream has produced its first event,
	// so what follows is a crash cutting a stream in progress.
	sc := bufio.NewScanner(resp.Body)
	var before, after []string
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if len(before) == 0 {
			before = append(before, d)
			if err := s.SetFault(sim.FaultCrash); err != nil {
				t.Fatal(err)
			}
			continue
		}
		after = append(after, d)
	}
	if len(before) == 0 {
		t.Fatalf("the stream ended before its first event (%v)", sc.Err())
	}
	if before[0] == "[DONE]" {
		t.Fatal("the first event was [DONE]: the stream had nothing to cut")
	}
	if n := len(after); n > 0 && after[n-1] == "[DONE]" {
		t.Fatalf("the stream completed through a crash (%d events after it)", n)
	}
	var fe *sim.InvalidFaultError
	if err := s.SetFault("bogus"); !errors.As(err, &fe) {
		t.Fatalf("bogus fault: %v", err)
	}
}
