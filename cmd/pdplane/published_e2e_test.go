package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestRegisterFromPublished is issue 10's "done when": agents with no spec
// file register an SGLang prefill and decode (the sim, serving what stock
// SGLang serves) from what they publish; the peers show model, role, TP,
// page size and dtype observed and the NIXL fields unknown; the pair is
// routable, a chat completion through the router moves KV, and GET
// /api/v1/pairs names what was not verified. On both stores, and for vLLM,
// whose role and TP size the operator declares.
func TestRegisterFromPublished(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		engine registry.Engine
		store  string
	}{
		{"sglang-memstore", registry.EngineSGLang, "memstore"},
		{"sglang-pgstore", registry.EngineSGLang, "pgstore"},
		{"vllm-memstore", registry.EngineVLLM, "memstore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := ""
			if tc.store == "pgstore" {
				dbURL, _ = registrytest.NewSchema(t)
			}
			testRegisterFromPublished(t, tc.engine, dbURL)
		})
	}
}

func testRegisterFromPublished(t *testing.T, engine registry.Engine, dbURL string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	cp := testControlPlane(t, dbURL, log)

	// The sims have no control plane of their own: like stock SGLang, the
	// decode hands its KV args to the prefill's bootstrap server itself.
	prefill, decode := simtest.Pair(t, engine, nil)
	for i, s := range []*sim.Sim{prefill, decode} {
		cfg := agent.PublishedConfig{Engine: engine, URL: s.URL()}
		if engine == registry.EngineVLLM { // vLLM publishes neither
			cfg.Role, cfg.TPSize = []registry.Role{registry.RolePrefill, registry.RoleDecode}[i], 1
		}
		eng, err := agent.NewPublishedEngine(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Config{ControlPlane: cp.BaseURL, JoinToken: "peer-tok"}, eng, log)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	simtest.WaitFor(t, "a routable pair", func() bool { ok, _ := cp.mirror.Snapshot().Routable(); return ok })

	var peers struct {
		Peers []map[string]any `json:"peers"`
	}
	getJSON(t, cp.BaseURL+"/api/v1/peers", &peers)
	if len(peers.Peers) != 2 {
		t.Fatalf("%d peers, want 2", len(peers.Peers))
	}
	for _, p := range peers.Peers {
		observed, unknown := stringList(p["observed"]), stringList(p["unknown"])
		want := []string{"role", "model", "parallelism.tp_size", "kv.page_size", "kv.dtype"}
		if engine == registry.EngineVLLM {
			want = []string{"model", "kv.page_size", "kv.dtype", "instance_id"}
		}
		for _, f := range want {
			if !slices.Contains(observed, f) {
				t.Errorf("%s: %s not observed (observed %q)", p["name"], f, observed)
			}
		}
		if !slices.Contains(unknown, "ranks") || p["ranks"] != nil {
			t.Errorf("%s: ranks should be unknown and absent: unknown %q, ranks %v", p["name"], unknown, p["ranks"])
		}
		kv := p["kv"].(map[string]any)
		if p["model"] != "sim-model" || kv["page_size"] != 4.0 || p["engine"] != string(engine) {
			t.Errorf("%s: model %v, page size %v, engine %v", p["name"], p["model"], kv["page_size"], p["engine"])
		}
	}

	var pairs struct {
		Pairs []struct {
			Compatible, Routable bool
			Verified             *bool
			Unverified           []string
		} `json:"pairs"`
	}
	getJSON(t, cp.BaseURL+"/api/v1/pairs", &pairs)
	if len(pairs.Pairs) != 1 {
		t.Fatalf("%d pairs, want 1", len(pairs.Pairs))
	}
	pr := pairs.Pairs[0]
	if !pr.Compatible || !pr.Routable || pr.Verified == nil || *pr.Verified ||
		!slices.Contains(pr.Unverified, "ranks[*].kv_mem_kinds") {
		t.Fatalf("pair: compatible %v routable %v verified %v unverified %q", pr.Compatible, pr.Routable, pr.Verified, pr.Unverified)
	}

	// SGLang's prefill writes the KV; vLLM's decode reads it.
	moved := func() int64 { return prefill.Stats().BytesMoved + decode.Stats().BytesMoved }
	before := moved()
	client := openai.NewClient(option.WithBaseURL(cp.BaseURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	resp, err := client.Chat.Completions.New(cctx, openai.ChatCompletionNewParams{
		Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		MaxTokens: openai.Int(2),
	})
	if err != nil {
		t.Fatalf("chat completion through the router: %v", err)
	}
	if len(resp.Choices) == 0 || moved() <= before {
		t.Fatalf("answer %+v; KV bytes moved %d -> %d", resp.Choices, before, moved())
	}
}

// getJSON GETs url as the admin and decodes its 200 answer into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	if err := fetchJSON(req, v); err != nil {
		t.Fatal(err)
	}
}

// fetchJSON sends req and decodes its answer, which must be a 200, into v.
func fetchJSON(req *http.Request, v any) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d", req.Method, req.URL, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	return nil
}

func stringList(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, s := range l {
		out = append(out, s.(string))
	}
	return out
}

// testControlPlane starts an in-process control plane on a free loopback
// port, on the store at databaseURL (the in-memory one when empty), with
// the tests' tokens ("peer-tok" to join, "admin-tok"), the default
// heartbeat and lease, and round-robin policies; it serves until the test
// ends.
func testControlPlane(t *testing.T, databaseURL string, log zerolog.Logger) *controlPlane {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := startControlPlane(ctx, serveConfig{
		addr: "127.0.0.1:0", databaseURL: databaseURL, joinTokens: "peer-tok", adminToken: "admin-tok",
		heartbeat: registry.DefaultHeartbeatInterval, leaseTTL: registry.DefaultLeaseTTL,
		prefillPolicy: "round_robin", decodePolicy: "round_robin",
	}, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cp.wait(ctx) }()
	t.Cleanup(func() { cancel(); <-errc })
	return cp
}
