package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

func newProbe(t *testing.T) *agent.EngineProbe {
	t.Helper()
	p, err := agent.NewEngineProbe(agent.ProbeConfig{Timeout: 2 * time.Second}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func setFault(t *testing.T, s *sim.Sim, fault string) {
	t.Helper()
	r, err := simtest.NewClient().SetFault(context.Background(), s, fault)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("set fault %s: %v %d %s", fault, err, r.Status, r.Body)
	}
}

// TestProbeThresholds: a crashed engine (the sim's crash fault drops every
// connection, as a dead process would) turns unhealthy at the third failed
// probe, not before, and healthy again at the second passing probe after
// it comes back: the defaults of SGLang's router (sgl-router
// src/config/types.rs HealthCheckConfig: failure_threshold 3,
// success_threshold 2).
func TestProbeThresholds(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			s := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, engine))
			p := newProbe(t)
			ctx := context.Background()
			if st := p.Probe(ctx, s.URL(), engine); !st.Healthy || st.Error != "" || st.Probes != 1 {
				t.Fatalf("first probe of a serving engine: %+v", st)
			}
			setFault(t, s, "crash")
			for i := 1; i <= 3; i++ {
				st := p.Probe(ctx, s.URL(), engine)
				if st.Healthy != (i < 3) {
					t.Fatalf("after %d failed probes: healthy=%v, want %v", i, st.Healthy, i < 3)
				}
				if i == 3 && !strings.Contains(st.Error, "/health") {
					t.Fatalf("unhealthy without the probe error: %+v", st)
				}
			}
			setFault(t, s, "none")
			if st := p.Probe(ctx, s.URL(), engine); st.Healthy {
				t.Fatalf("healthy after one passing probe: %+v", st)
			}
			if st := p.Probe(ctx, s.URL(), engine); !st.Healthy || st.Error != "" {
				t.Fatalf("after two passing probes: %+v", st)
			}
		})
	}
}

// TestProbeNon200IsFailure: an engine that answers /health with 503 (SGLang
// http_server.py health_generate while starting or shutting down, vLLM
// api_server.py health on EngineDeadError) fails the probe like one that
// does not answer, and the error says what it answered.
func TestProbeNon200IsFailure(t *testing.T) {
	t.Parallel()
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer dead.Close()
	p := newProbe(t)
	var st agent.EngineStatus
	for range 3 {
		st = p.Probe(context.Background(), dead.URL, registry.EngineVLLM)
	}
	if st.Healthy || st.Error != "GET /health: 503 Service Unavailable" {
		t.Fatalf("after three 503s: %+v", st)
	}
}

// TestProbeReadsLoad reads a busy decode's load the way each engine
// publishes it: SGLang's /v1/loads, SGLang's /get_load where /v1/loads is
// missing (versions before it), vLLM's /metrics.
func TestProbeReadsLoad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		engine registry.Engine
		legacy bool
	}{
		{"sglang v1/loads", registry.EngineSGLang, false},
		{"sglang get_load", registry.EngineSGLang, true},
		{"vllm metrics", registry.EngineVLLM, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, d := simtest.BusyPair(t, tc.engine)
			target := d.URL()
			if tc.legacy {
				u, _ := url.Parse(d.URL())
				proxy := httputil.NewSingleHostReverseProxy(u)
				older := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/v1/loads" {
						http.NotFound(w, r)
						return
					}
					proxy.ServeHTTP(w, r)
				}))
				t.Cleanup(older.Close)
				target = older.URL
			}
			st := newProbe(t).Probe(context.Background(), target, tc.engine)
			if !st.Healthy || st.Load.Running != 1 || st.Load.Queued != 0 {
				t.Fatalf("probe of a decode running one request: %+v", st)
			}
			if !tc.legacy && !(st.Load.KVUsage > 0) { // /get_load has no KV usage
				t.Fatalf("probe of a decode holding KV: usage %v", st.Load.KVUsage)
			}
		})
	}
}

// TestParseVLLMMetrics: series of several engines (DP ranks) add up, the
// fullest engine's KV usage counts, and vLLM's older gpu_cache_usage_perc
// name is read where kv_cache_usage_perc is missing.
func TestParseVLLMMetrics(t *testing.T) {
	t.Parallel()
	text := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.75
`
	l, err := agent.ParseVLLMMetrics(strings.NewReader(text))
	if err != nil || l != (registry.Load{Running: 5, Queued: 5, KVUsage: 0.75}) {
		t.Fatalf("ParseVLLMMetrics = %+v, %v", l, err)
	}
	// Without TYPE lines the gauges parse as untyped; absurd figures are
	// bounded to what a heartbeat may carry.
	l, err = agent.ParseVLLMMetrics(strings.NewReader("vllm:num_requests_running 2\nvllm:num_requests_waiting 1e300\nvllm:kv_cache_usage_perc 1.5\n"))
	if err != nil || l != (registry.Load{Running: 2, Queued: registry.MaxLoadCount, KVUsage: 1}) {
		t.Fatalf("ParseVLLMMetrics(untyped) = %+v, %v", l, err)
	}
	if _, err := agent.ParseVLLMMetrics(strings.NewReader("# TYPE other gauge\nother 1\n")); err == nil {
		t.Fatal("metrics without vllm:num_requests_running parsed")
	}
	if _, err := agent.ParseVLLMMetrics(strings.NewReader("vllm:num_requests_running{ 1\n")); err == nil {
		t.Fatal("malformed metrics parsed")
	}
}

// runSimAgent runs an agent for a started sim, probing it every 10ms.
func runSimAgent(t *testing.T, cpURL string, s *sim.Sim) *agent.Agent {
	t.Helper()
	a, _, _ := startAgent(t, agent.Config{ControlPlane: cpURL, JoinToken: "tok", MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		OnRegistered: func(p api.Peer) { s.SetPeerID(p.Id) },
		Probe:        agent.ProbeConfig{Interval: 10 * time.Millisecond, Timeout: 2 * time.Second}},
		s, testLog(t))
	return a
}

func routable(cp controlPlane) bool {
	ok, _ := cp.mirror.Snapshot().Routable()
	return ok
}

// TestCrashedEngineLeavesRouting is the whole path: the decode's engine
// crashes while its agent lives; the agent's probes call it down after
// three failures, its heartbeat says so, the peer turns unhealthy (the
// probe error as its reason) and leaves routing; when the engine is back,
// two passing probes bring the peer back to ready and into routing. The
// agent heartbeats throughout.
func TestCrashedEngineLeavesRouting(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	runSimAgent(t, cp.url, p)
	da := runSimAgent(t, cp.url, d)
	waitUntil(t, "a routable pair", func() bool { return routable(cp) })

	setFault(t, d, "crash")
	dp := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateUnhealthy })
	if !strings.HasPrefix(dp.StateReason, "engine unhealthy: ") || !strings.Contains(dp.StateReason, "/health") {
		t.Fatalf("unhealthy peer's reason %q, want the probe error", dp.StateReason)
	}
	if st := da.EngineStatus(); st.Healthy {
		t.Fatalf("the agent's probes call the crashed engine healthy: %+v", st)
	}
	waitUntil(t, "the decode out of routing", func() bool { return !routable(cp) })
	_, reason := cp.mirror.Snapshot().Routable()
	if !strings.Contains(reason, "no ready decode (unhealthy: decode d0: engine unhealthy") {
		t.Fatalf("readiness reason %q does not name the unhealthy decode", reason)
	}
	// The agent keeps heartbeating: the lease of the unhealthy peer moves on.
	lease := dp.LeaseExpiry
	waitPeer(t, cp.store, "d0", func(p registry.Peer) bool {
		return p.State == registry.StateUnhealthy && p.LeaseExpiry.After(lease)
	})

	setFault(t, d, "none")
	waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	waitUntil(t, "the decode back in routing", func() bool { return routable(cp) })
	if p, _ := cp.store.Get(context.Background(), dp.ID); p.Generation != dp.Generation {
		t.Fatalf("a crash the engine came back from changed the generation: %d → %d", dp.Generation, p.Generation)
	}
}

// TestHeartbeatCarriesLoad: under traffic, the load a busy decode's agent
// heartbeats is the engine's own, for both engine kinds.
func TestHeartbeatCarriesLoad(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			cp := startControlPlane(t, nil)
			p, d := simtest.BusyPair(t, engine)
			runSimAgent(t, cp.url, p)
			runSimAgent(t, cp.url, d)
			got := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.Load.Running == 1 })
			if !(got.Load.KVUsage > 0) || got.State != registry.StateReady {
				t.Fatalf("busy decode: state %s load %+v", got.State, got.Load)
			}
		})
	}
}

// FuzzParseVLLMMetrics: whatever an engine's /metrics holds, the parser
// neither panics nor returns a load the control plane would refuse.
func FuzzParseVLLMMetrics(f *testing.F) {
	f.Add("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 3\nvllm:kv_cache_usage_perc 0.5\n")
	f.Add("vllm:num_requests_running -4\nvllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc +Inf\n")
	f.Add("vllm:num_requests_running 1e300\n")
	f.Fuzz(func(t *testing.T, text string) {
		l, err := agent.ParseVLLMMetrics(strings.NewReader(text))
		if err != nil {
			return
		}
		hb := registry.Heartbeat{InstanceID: "fuzz", Load: l}
		if verr := hb.Validate(); verr != nil {
			t.Fatalf("parsed load %+v fails heartbeat validation: %v", l, verr)
		}
	})
}

// TestProbeKilledEngine: an engine process that is gone (kill -9: nothing
// listens on its port any more) fails the probes like a crashed one, and the
// error says the connection was refused.
func TestProbeKilledEngine(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	p := newProbe(t)
	if st := p.Probe(context.Background(), s.URL(), registry.EngineSGLang); !st.Healthy {
		t.Fatalf("probe of a serving engine: %+v", st)
	}
	s.Close() // the listener is gone, as with a killed process
	var st agent.EngineStatus
	for i := 1; i <= 3; i++ {
		st = p.Probe(context.Background(), s.URL(), registry.EngineSGLang)
		if st.Healthy != (i < 3) {
			t.Fatalf("after %d probes of a killed engine: %+v", i, st)
		}
	}
	if !strings.Contains(st.Error, "connection refused") {
		t.Fatalf("probe error %q does not say the connection was refused", st.Error)
	}
}

// TestProbeStartingEngine: an engine is not healthy before it first answers
// (SGLang answers /health 503 while ServerStatus is Starting, http_server.py
// health_generate), and healthy from its first passing probe: there is no
// earlier failure to recover from.
func TestProbeStartingEngine(t *testing.T) {
	t.Parallel()
	var up atomic.Bool
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !up.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
		case r.URL.Path == "/health":
			w.WriteHeader(http.StatusOK)
		default:
			http.NotFound(w, r) // no load endpoints: the health verdict alone counts here
		}
	}))
	defer eng.Close()
	p := newProbe(t)
	if st := p.Status(); st.Healthy || st.Probes != 0 {
		t.Fatalf("status before any probe: %+v, want not healthy", st)
	}
	if st := p.Probe(context.Background(), eng.URL, registry.EngineSGLang); st.Healthy || st.Error != "GET /health: 503 Service Unavailable" {
		t.Fatalf("probe of a starting engine: %+v", st)
	}
	up.Store(true)
	if st := p.Probe(context.Background(), eng.URL, registry.EngineSGLang); !st.Healthy || st.Error != "" {
		t.Fatalf("first passing probe: %+v, want healthy at once", st)
	}
}
