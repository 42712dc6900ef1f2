package sim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim/simtest"
)

// getJSON decodes GET url into v and returns the status.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
	return resp.StatusCode
}

// TestSGLangLoadEndpoints pins SGLang's load formats: GET /v1/loads
// (python/sglang/srt/entrypoints/v1_loads.py get_loads: timestamp, version,
// accelerator, num_accelerators, loads[]; each rank's core fields from
// managers/load_snapshot.py LoadSnapshot.to_dict) and the deprecated GET
// /get_load (entrypoints/http_server.py get_load: a list per DP rank,
// num_reqs = running + waiting). The counts are the engine's real ones.
func TestSGLangLoadEndpoints(t *testing.T) {
	t.Parallel()
	p, d := simtest.BusyPair(t, registry.EngineSGLang)
	var loads map[string]any
	if code := getJSON(t, d.URL()+"/v1/loads", &loads); code != http.StatusOK {
		t.Fatalf("/v1/loads: %d", code)
	}
	for _, k := range []string{"timestamp", "version", "accelerator", "num_accelerators", "loads"} {
		if _, ok := loads[k]; !ok {
			t.Errorf("/v1/loads has no %q: %v", k, loads)
		}
	}
	ranks, _ := loads["loads"].([]any)
	if len(ranks) != 1 {
		t.Fatalf("/v1/loads loads = %v, want one DP rank", loads["loads"])
	}
	rank := ranks[0].(map[string]any)
	for _, k := range []string{"dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "num_total_tokens",
		"max_total_num_tokens", "max_running_requests", "token_usage", "gen_throughput", "cache_hit_rate", "utilization"} {
		if _, ok := rank[k]; !ok {
			t.Errorf("/v1/loads rank has no %q: %v", k, rank)
		}
	}
	if rank["num_running_reqs"] != 1.0 || rank["num_waiting_reqs"] != 0.0 || !(rank["token_usage"].(float64) > 0) {
		t.Errorf("/v1/loads rank under one running request: %v", rank)
	}

	var legacy []map[string]any
	if code := getJSON(t, d.URL()+"/get_load", &legacy); code != http.StatusOK || len(legacy) != 1 {
		t.Fatalf("/get_load: %d %v", code, legacy)
	}
	if legacy[0]["dp_rank"] != 0.0 || legacy[0]["num_reqs"] != 1.0 || legacy[0]["num_waiting_reqs"] != 0.0 {
		t.Errorf("/get_load under one running request: %v", legacy[0])
	}

	// A decode request whose prefill never gets it waits for its KV.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go simtest.NewClient().Post(ctx, d.URL(), "/generate", map[string]any{
		"text": "waiting", "sampling_params": map[string]any{"max_new_tokens": 1},
		"bootstrap_host": "127.0.0.1", "bootstrap_port": p.BootstrapPort(), "bootstrap_room": simtest.Room()}, nil)
	waitFor(t, "a waiting request", func() bool { return d.Load().Queued == 1 })
	if code := getJSON(t, d.URL()+"/v1/loads", &loads); code != http.StatusOK {
		t.Fatalf("/v1/loads: %d", code)
	}
	if rank := loads["loads"].([]any)[0].(map[string]any); rank["num_running_reqs"] != 1.0 || rank["num_waiting_reqs"] != 1.0 {
		t.Errorf("/v1/loads with one running and one waiting: %v", rank)
	}
}

// TestVLLMMetricsEndpoint pins vLLM's /metrics gauges (vllm/v1/metrics/
// loggers.py PrometheusStatLogger: vllm:num_requests_running,
// vllm:num_requests_waiting, vllm:kv_cache_usage_perc, labelled engine and
// model_name) and that an SGLang engine has no such endpoint.
func TestVLLMMetricsEndpoint(t *testing.T) {
	t.Parallel()
	_, d := simtest.BusyPair(t, registry.EngineVLLM)
	resp, err := http.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	l, err := agent.ParseVLLMMetrics(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if l.Running != 1 || l.Queued != 0 || !(l.KVUsage > 0) {
		t.Fatalf("vLLM metrics under one running request: %+v", l)
	}
	for _, path := range []string{"/v1/loads", "/get_load", "/health_generate"} {
		if code := getJSON(t, d.URL()+path, new(any)); code != http.StatusNotFound {
			t.Errorf("vLLM sim GET %s: %d, want 404 as vLLM has none", path, code)
		}
	}
}
