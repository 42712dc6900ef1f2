package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim/simtest"
)

// engineDouble serves fixed answers per path, changeable while it runs;
// a path it does not know is a 404, as FastAPI answers.
type engineDouble struct {
	mu     sync.Mutex
	routes map[string]answer
	served map[string]int // "path status" -> answers given
	srv    *httptest.Server
}

type answer struct {
	status      int
	contentType string
	body        string
}

func jsonAnswer(body string) answer { return answer{200, "application/json", body} }

func newEngineDouble(t testing.TB, routes map[string]answer) *engineDouble {
	d := &engineDouble{routes: routes, served: map[string]int{}}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		a, ok := d.routes[r.URL.Path]
		if ok {
			d.served[fmt.Sprintf("%s %d", r.URL.Path, a.status)]++
		}
		d.mu.Unlock()
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
			return
		}
		if a.contentType != "" {
			w.Header().Set("Content-Type", a.contentType)
		}
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *engineDouble) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.served[key]
}

func (d *engineDouble) set(path string, a answer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.routes[path] = a
}

// sglangServerInfo is a /server_info answer as SGLang builds it
// (python/sglang/srt/entrypoints/http_server.py server_info:
// dataclasses.asdict(ServerArgs) merged with the scheduler info, plus
// internal_states and version), cut to a realistic subset of
// server_args.py's fields.
const sglangServerInfo = `{"model_path":"meta-llama/Llama-3.1-8B-Instruct","tokenizer_path":"meta-llama/Llama-3.1-8B-Instruct",
"served_model_name":"meta-llama/Llama-3.1-8B-Instruct","dtype":"auto","kv_cache_dtype":"auto","page_size":1,
"tp_size":2,"dp_size":1,"pp_size":1,"enable_dp_attention":false,"host":"0.0.0.0","port":30000,
"disaggregation_mode":"prefill","disaggregation_bootstrap_port":8998,"disaggregation_transfer_backend":"nixl",
"max_total_num_tokens":120000,"max_req_input_len":131066,"internal_states":[{"last_gen_throughput":0.0}],"version":"0.5.4"}`

// sglangModelInfo is http_server.py get_model_info's answer.
const sglangModelInfo = `{"model_path":"meta-llama/Llama-3.1-8B-Instruct","tokenizer_path":"meta-llama/Llama-3.1-8B-Instruct",
"is_generation":true,"preferred_sampling_params":null,"weight_version":"default"}`

const sglangModels = `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1,"owned_by":"sglang","root":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":131072}]}`

func sglangRoutes() map[string]answer {
	return map[string]answer{
		"/server_info":    jsonAnswer(sglangServerInfo),
		"/get_model_info": jsonAnswer(sglangModelInfo),
		"/v1/models":      jsonAnswer(sglangModels),
		"/health":         {200, "", ""},
	}
}

// publishedSGLang reads an SGLang engine double serving sglangRoutes, with
// edit (when set) applied to them, through a PublishedEngine whose config
// is cfg with the double's URL.
func publishedSGLang(t testing.TB, edit func(r map[string]answer), cfg agent.PublishedConfig) (*engineDouble, *agent.PublishedEngine) {
	t.Helper()
	routes := sglangRoutes()
	if edit != nil {
		edit(routes)
	}
	d := newEngineDouble(t, routes)
	cfg.Engine, cfg.URL = registry.EngineSGLang, d.srv.URL
	e, err := agent.NewPublishedEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, e
}

func writeModelDir(t *testing.T, dir, config string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// llamaConfig is the shape of Llama-3.1-8B's config.json.
const llamaConfig = `{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"num_attention_heads":32,
"num_hidden_layers":32,"num_key_value_heads":8,"torch_dtype":"bfloat16","vocab_size":128256}`

func TestPublishedSGLang(t *testing.T) {
	t.Parallel()
	llamaDir := writeModelDir(t, filepath.Join(t.TempDir(), "hub", "models--meta-llama--Llama-3.1-8B-Instruct", "snapshots", "0e9e39f"), llamaConfig)
	for _, tc := range []struct {
		name     string
		edit     func(r map[string]answer)
		modelDir string
		check    func(t *testing.T, s registry.PeerSpec)
	}{
		{name: "newer names, no model dir", check: func(t *testing.T, s registry.PeerSpec) {
			if s.Role != registry.RolePrefill || s.Model != "meta-llama/Llama-3.1-8B-Instruct" || s.Parallelism.TPSize != 2 ||
				s.KV.PageSize != 1 || s.KV.DType != "auto" || s.BootstrapPort != 8998 {
				t.Fatalf("spec %+v", s)
			}
			if s.KV.NumLayers != 0 || s.Ranks != nil || !slices.Equal(s.Unknown, registry.UnknownableFields()) {
				t.Fatalf("shape and ranks must stay unknown: kv %+v, unknown %q", s.KV, s.Unknown)
			}
		}},
		{name: "older names", edit: func(r map[string]answer) {
			r["/get_server_info"] = r["/server_info"]
			delete(r, "/server_info")
		}, check: func(t *testing.T, s registry.PeerSpec) {
			if s.Role != registry.RolePrefill || s.Parallelism.TPSize != 2 {
				t.Fatalf("spec %+v", s)
			}
		}},
		{name: "model_info under its newer name", edit: func(r map[string]answer) {
			r["/model_info"] = r["/get_model_info"]
			delete(r, "/get_model_info")
		}, check: func(t *testing.T, s registry.PeerSpec) {
			if s.Model != "meta-llama/Llama-3.1-8B-Instruct" {
				t.Fatalf("model %q", s.Model)
			}
		}},
		{name: "config.json gives the shape and the dtype auto means", modelDir: llamaDir, check: func(t *testing.T, s registry.PeerSpec) {
			if s.KV != (registry.KVGeometry{PageSize: 1, DType: "bfloat16", NumLayers: 32, NumKVHeads: 8, HeadDim: 128}) {
				t.Fatalf("kv %+v", s.KV)
			}
			if !slices.Equal(s.Unknown, []string{"ranks"}) || s.Provenance(registry.FieldNumLayers) != registry.Observed {
				t.Fatalf("unknown %q observed %q", s.Unknown, s.Observed)
			}
		}},
		{name: "DP attention splits attention TP", edit: func(r map[string]answer) {
			r["/server_info"] = jsonAnswer(strings.NewReplacer(`"tp_size":2,"dp_size":1`, `"tp_size":8,"dp_size":4`,
				`"enable_dp_attention":false`, `"enable_dp_attention":true`).Replace(sglangServerInfo))
		}, check: func(t *testing.T, s registry.PeerSpec) {
			if s.Parallelism.TPSize != 8 || s.Parallelism.DPSize != 4 || s.Parallelism.AttnTPSize != 2 {
				t.Fatalf("parallelism %+v", s.Parallelism)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, e := publishedSGLang(t, tc.edit, agent.PublishedConfig{ModelDir: tc.modelDir})
			s, err := e.Spec(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Validate(); err != nil {
				t.Fatalf("spec refused: %v", err)
			}
			tc.check(t, s)
		})
	}
}

// TestPublishedBadEngine pins that an engine that cannot be read gets an
// error naming its URL and the endpoint, and no registration.
func TestPublishedBadEngine(t *testing.T) {
	t.Parallel()
	otherDir := writeModelDir(t, filepath.Join(t.TempDir(), "models--meta-llama--Llama-3.2-1B", "snapshots", "abc"), llamaConfig)
	for _, tc := range []struct {
		name     string
		edit     func(r map[string]answer)
		modelDir string
		want     []string // in the error, besides the URL
		status   int      // of the *EndpointError; -1 when not one
	}{
		{name: "HTML answer", edit: func(r map[string]answer) {
			r["/server_info"] = answer{200, "text/html; charset=utf-8", "<html><body>login</body></html>"}
		}, want: []string{"/server_info", "text/html"}, status: 200},
		{name: "no server info at all", edit: func(r map[string]answer) { delete(r, "/server_info") },
			want: []string{"/get_server_info", "404"}, status: 404},
		{name: "server info not JSON", edit: func(r map[string]answer) { r["/server_info"] = jsonAnswer("{") },
			want: []string{"/server_info", "parse JSON"}, status: 200},
		{name: "no page size", edit: func(r map[string]answer) {
			r["/server_info"] = jsonAnswer(strings.Replace(sglangServerInfo, `"page_size":1,`, "", 1))
		}, want: []string{"/server_info", "page_size"}, status: 200},
		{name: "not in PD mode", edit: func(r map[string]answer) {
			r["/server_info"] = jsonAnswer(strings.Replace(sglangServerInfo, `"disaggregation_mode":"prefill"`, `"disaggregation_mode":"null"`, 1))
		}, want: []string{"/server_info", "disaggregation_mode"}, status: 200},
		{name: "DP attention over more groups than TP ranks", edit: func(r map[string]answer) {
			r["/server_info"] = jsonAnswer(strings.NewReplacer(`"tp_size":2,"dp_size":1`, `"tp_size":2,"dp_size":4`,
				`"enable_dp_attention":false`, `"enable_dp_attention":true`).Replace(sglangServerInfo))
		}, want: []string{"/server_info", "tp_size 2", "dp_size 4"}, status: 200},
		{name: "model info missing", edit: func(r map[string]answer) { delete(r, "/get_model_info") },
			want: []string{"/model_info", "404"}, status: 404},
		{name: "served model not listed", edit: func(r map[string]answer) {
			r["/v1/models"] = jsonAnswer(`{"object":"list","data":[{"id":"other"}]}`)
		}, want: []string{"/v1/models", "other"}, status: -1},
		{name: "config.json of another model", modelDir: otherDir,
			want: []string{"meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B-Instruct"}, status: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, e := publishedSGLang(t, tc.edit, agent.PublishedConfig{ModelDir: tc.modelDir})
			s, err := e.Spec(context.Background())
			if err == nil {
				t.Fatalf("no error; spec %+v", s)
			}
			if s.Name != "" || s.Model != "" {
				t.Fatalf("a failed read returned values: %+v", s)
			}
			for _, w := range append(tc.want, d.srv.URL) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			var ee *agent.EndpointError
			if got := errors.As(err, &ee); got != (tc.status != -1) || (got && ee.Status != tc.status) {
				t.Errorf("error %v: endpoint error %v, want status %d", err, got, tc.status)
			}
		})
	}
}

func TestPublishedUnreachable(t *testing.T) {
	t.Parallel()
	d := newEngineDouble(t, sglangRoutes())
	url := d.srv.URL
	d.srv.Close()
	e, err := agent.NewPublishedEngine(agent.PublishedConfig{Engine: registry.EngineSGLang, URL: url})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Spec(context.Background())
	var ee *agent.EndpointError
	if !errors.As(err, &ee) || ee.Status != 0 || ee.Endpoint != "/server_info" || !strings.Contains(err.Error(), url) {
		t.Fatalf("error %v, want an endpoint error naming %s and /server_info", err, url)
	}
}

func TestPublishedFromSims(t *testing.T) {
	t.Parallel()
	t.Run("sglang", func(t *testing.T) {
		t.Parallel()
		s := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang))
		e, err := agent.NewPublishedEngine(agent.PublishedConfig{Engine: registry.EngineSGLang, URL: s.URL()})
		if err != nil {
			t.Fatal(err)
		}
		spec, err := e.Spec(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if spec.Role != registry.RolePrefill || spec.Model != "sim-model" || spec.KV.PageSize != 4 || spec.BootstrapPort == 0 {
			t.Fatalf("spec %+v", spec)
		}
	})
	t.Run("vllm", func(t *testing.T) {
		t.Parallel()
		s := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineVLLM))
		_, err := agent.NewPublishedEngine(agent.PublishedConfig{Engine: registry.EngineVLLM, URL: s.URL()})
		if err == nil || !strings.Contains(err.Error(), "role") {
			t.Fatalf("vLLM without a declared role: %v", err)
		}
		e, err := agent.NewPublishedEngine(agent.PublishedConfig{Engine: registry.EngineVLLM, URL: s.URL(), Role: registry.RoleDecode, TPSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		spec, err := e.Spec(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if spec.Role != registry.RoleDecode || spec.Model != "sim-model" || spec.KV.PageSize != 4 || spec.KV.DType == "" ||
			!strings.HasPrefix(spec.InstanceID, "start-") || spec.Provenance("instance_id") != registry.Observed ||
			spec.Provenance("role") != registry.Declared {
			t.Fatalf("spec %+v", spec)
		}
	})
}

// vllmMetrics is vLLM's /metrics as prometheus_client writes it: the info
// gauge of v1/metrics/loggers.py log_metrics_info("cache_config", ...) with
// CacheConfig's fields as labels, and the process collector's start time.
func vllmMetrics(start string) string {
	return `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="fp8_e4m3",calculate_kv_scales="False",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27000"} 1.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds ` + start + `
`
}

func TestPublishedVLLMRestart(t *testing.T) {
	t.Parallel()
	metrics := answer{200, "text/plain; version=0.0.4; charset=utf-8", vllmMetrics("1.76e+09")}
	d := newEngineDouble(t, map[string]answer{
		"/v1/models": jsonAnswer(`{"object":"list","data":[{"id":"m","object":"model","root":"/models/m","max_model_len":4096}]}`),
		"/version":   jsonAnswer(`{"version":"0.11.0"}`),
		"/metrics":   metrics,
		"/health":    {200, "", ""},
	})
	e, err := agent.NewPublishedEngine(agent.PublishedConfig{Engine: registry.EngineVLLM, URL: d.srv.URL, Role: registry.RolePrefill, TPSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.KV.PageSize != 16 || s.KV.DType != "fp8_e4m3" || s.Model != "m" || s.Parallelism.TPSize != 2 {
		t.Fatalf("spec %+v", s)
	}
	if e.Restarted(context.Background(), s.InstanceID) {
		t.Fatal("same process start time read as a restart")
	}
	metrics.body = vllmMetrics("1.76000001e+09")
	d.set("/metrics", metrics)
	if !e.Restarted(context.Background(), s.InstanceID) {
		t.Fatal("a new process start time is a restart")
	}
	d.set("/version", jsonAnswer(`{"object":"list"}`))
	if _, err := e.Spec(context.Background()); err == nil || !strings.Contains(err.Error(), d.srv.URL+": GET /version") {
		t.Fatalf("a /version without a version: %v", err)
	}
	d.set("/version", jsonAnswer(`{"version":"0.11.0"}`))
	d.set("/metrics", answer{200, "text/plain", "# no cache config\n"})
	if _, err := e.Spec(context.Background()); err == nil || !strings.Contains(err.Error(), "vllm:cache_config_info") {
		t.Fatalf("metrics without the cache config: %v", err)
	}
}

// TestPublishedHealthEpoch: without a published start time, /health down
// then up is a new instance.
func TestPublishedHealthEpoch(t *testing.T) {
	t.Parallel()
	d, e := publishedSGLang(t, nil, agent.PublishedConfig{})
	s, err := e.Spec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if e.Restarted(ctx, s.InstanceID) {
		t.Fatal("healthy engine read as restarted")
	}
	d.set("/health", answer{503, "", ""})
	if e.Restarted(ctx, s.InstanceID) {
		t.Fatal("an engine that is down has not restarted yet")
	}
	d.set("/health", answer{200, "", ""})
	if !e.Restarted(ctx, s.InstanceID) {
		t.Fatal("/health down then up is a restart")
	}
	s2, err := e.Spec(ctx)
	if err != nil || s2.InstanceID == s.InstanceID {
		t.Fatalf("new instance id %q (was %q): %v", s2.InstanceID, s.InstanceID, err)
	}
}

// TestPublishedHealthEpochProcessGone: a restart as it happens, the
// engine's process gone (nothing answers, /metrics included), then back,
// is a new instance too; the /metrics error must not hide the down half.
func TestPublishedHealthEpochProcessGone(t *testing.T) {
	t.Parallel()
	d := newEngineDouble(t, sglangRoutes())
	var down atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			// A dead process: the connection closes without an answer.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		d.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	e, err := agent.NewPublishedEngine(agent.PublishedConfig{Engine: registry.EngineSGLang, URL: front.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := e.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	if e.Restarted(ctx, s.InstanceID) {
		t.Fatal("an engine that is gone has not restarted yet")
	}
	down.Store(false)
	if !e.Restarted(ctx, s.InstanceID) {
		t.Fatal("the engine's process gone, then answering again, is a restart")
	}
}

// TestPublishedRestartBumpsGeneration: the agent notices the restart and
// registers the new instance, which the registry makes generation 2.
func TestPublishedRestartBumpsGeneration(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	d, e := publishedSGLang(t, nil, agent.PublishedConfig{Name: "p0"})
	runAgent(t, cp.url, e)
	first := waitPeer(t, cp.store, "p0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	d.set("/health", answer{503, "", ""})
	simtest.WaitFor(t, "the agent to see /health fail", func() bool { return d.count("/health 503") > 0 })
	d.set("/health", answer{200, "", ""}) // the engine is back: a new instance
	p := waitPeer(t, cp.store, "p0", func(p registry.Peer) bool { return p.Generation == first.Generation+1 })
	if p.InstanceID == first.InstanceID || p.ID != first.ID {
		t.Fatalf("after the restart: id %s instance %s (was %s %s)", p.ID, p.InstanceID, first.ID, first.InstanceID)
	}
}

// syncBuffer collects log lines from the agent's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPublishedAgentRetries: an engine that answers HTML is logged by URL
// and endpoint, nothing is registered, and the agent registers the engine
// once it answers properly.
func TestPublishedAgentRetries(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	good := sglangRoutes()["/server_info"]
	d, e := publishedSGLang(t, func(r map[string]answer) {
		r["/server_info"] = answer{200, "text/html", "<html>proxy login</html>"}
	}, agent.PublishedConfig{Name: "p0"})
	var logs syncBuffer
	startAgent(t, agent.Config{ControlPlane: cp.url, JoinToken: "tok", MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Probe: agent.ProbeConfig{Disabled: true}}, e, zerolog.New(&logs))

	simtest.WaitFor(t, "two failed reads", func() bool { return d.count("/server_info 200") >= 2 })
	if peers, _ := cp.store.List(context.Background(), registry.Filter{}); len(peers) != 0 {
		t.Fatalf("registered from an HTML answer: %+v", peers)
	}
	line := d.srv.URL + ": GET /server_info"
	if !strings.Contains(logs.String(), line) || !strings.Contains(logs.String(), "retry_in") {
		t.Fatalf("log does not name %q with a retry:\n%s", line, logs.String())
	}
	d.set("/server_info", good)
	waitPeer(t, cp.store, "p0", func(p registry.Peer) bool { return p.Model == "meta-llama/Llama-3.1-8B-Instruct" })
}

func TestReadModelConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, config string
		want         agent.ModelConfig
		err          string
	}{
		{name: "GQA, head dim from hidden size", config: llamaConfig,
			want: agent.ModelConfig{NumLayers: 32, NumKVHeads: 8, HeadDim: 128, TorchDType: "bfloat16"}},
		{name: "explicit head dim, newer dtype key",
			config: `{"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"hidden_size":1024,"dtype":"bfloat16"}`,
			want:   agent.ModelConfig{NumLayers: 28, NumKVHeads: 8, HeadDim: 128, TorchDType: "bfloat16"}},
		{name: "no GQA", config: `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256}`,
			want: agent.ModelConfig{NumLayers: 2, NumKVHeads: 4, HeadDim: 64}},
		// DeepSeek-V3's config.json: MLA keeps one latent of kv_lora_rank +
		// qk_rope_head_dim per token.
		{name: "MLA", config: `{"num_hidden_layers":61,"num_attention_heads":128,"num_key_value_heads":128,"hidden_size":7168,
			"kv_lora_rank":512,"qk_rope_head_dim":64,"qk_nope_head_dim":128,"torch_dtype":"bfloat16"}`,
			want: agent.ModelConfig{NumLayers: 61, NumKVHeads: 1, HeadDim: 576, IsMLA: true, TorchDType: "bfloat16"}},
		{name: "multimodal text config", config: `{"torch_dtype":"bfloat16","text_config":{"num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128}}`,
			want: agent.ModelConfig{NumLayers: 40, NumKVHeads: 8, HeadDim: 128, TorchDType: "bfloat16"}},
		{name: "no layers", config: `{"num_attention_heads":4,"hidden_size":256}`, err: "num_hidden_layers"},
		{name: "no head dim", config: `{"num_hidden_layers":2,"num_key_value_heads":2}`, err: "head_dim"},
		{name: "not JSON", config: `{`, err: "parse model config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := writeModelDir(t, t.TempDir(), tc.config)
			got, err := agent.ReadModelConfig(dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzPublishedServerInfo feeds /server_info bodies to the reader: it must
// never panic, and what it returns is a registration the registry accepts,
// with the ranks unknown and the model the engine named.
func FuzzPublishedServerInfo(f *testing.F) {
	f.Add(sglangServerInfo)
	f.Add(`{}`)
	f.Add(`null`)
	f.Add(`{"disaggregation_mode":"decode","page_size":0,"tp_size":1,"kv_cache_dtype":"auto","served_model_name":"meta-llama/Llama-3.1-8B-Instruct"}`)
	f.Add(`{"disaggregation_mode":"prefill","page_size":16,"tp_size":1,"dp_size":4,"enable_dp_attention":true,"kv_cache_dtype":"fp8_e5m2","served_model_name":"meta-llama/Llama-3.1-8B-Instruct"}`)
	f.Add(`{"disaggregation_mode":"decode","page_size":-1,"tp_size":-3,"kv_cache_dtype":"\u0000","served_model_name":"meta-llama/Llama-3.1-8B-Instruct"}`)
	d, e := publishedSGLang(f, nil, agent.PublishedConfig{})
	f.Fuzz(func(t *testing.T, body string) {
		d.set("/server_info", jsonAnswer(body))
		s, err := e.Spec(context.Background())
		if err != nil {
			return
		}
		if verr := s.Validate(); verr != nil || s.Knows(registry.FieldRanks) || s.Model != "meta-llama/Llama-3.1-8B-Instruct" {
			t.Fatalf("accepted %q as %+v (validate: %v)", body, s, verr)
		}
	})
}
