package realengine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
)

// suite is what every test of the package shares: the binaries, the
// model and the two engines, started once (a start costs a minute).
type suite struct {
	bin      string // pdplane
	python   string // the vLLM venv's
	modelDir string
	dir      string // scratch: pid files, the supervisor's socket
	prefill  *vllmEngine
	decode   *vllmEngine
	dbURL    string // PostgreSQL for the control plane, when set
}

// controlPlane is one `pdplane serve` process.
type controlPlane struct {
	p   *bench.Process
	URL string
}

// startControlPlane starts `pdplane serve` on the embedded store, or on
// PostgreSQL when dbURL is set, with the heartbeats and leases of a
// small fleet.
func (s *suite) startControlPlane(t *testing.T, dbURL string, extra ...string) *controlPlane {
	t.Helper()
	addr := bench.FreeAddr(t)
	args := []string{s.bin, "serve", "--addr", addr, "--log-level", "info",
		"--heartbeat-interval", "1s", "--lease-ttl", "10s"}
	if dbURL != "" {
		args = append(args, "--database-url", dbURL)
	}
	args = append(args, extra...)
	p, err := bench.Start("pdplane-serve", nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	cp := &controlPlane{p: p, URL: "http://" + addr}
	stopAtEnd(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := bench.WaitHTTP(ctx, cp.URL+"/healthz", p); err != nil {
		t.Fatal(err)
	}
	return cp
}

// startAgent starts `pdplane agent --engine vllm` beside e, registering
// it from what it publishes with the role and TP size vLLM does not
// publish, and the model directory for the KV shape.
func (s *suite) startAgent(t *testing.T, cp *controlPlane, e *vllmEngine, extra ...string) *bench.Process {
	t.Helper()
	args := []string{s.bin, "agent", "--engine", "vllm", "--engine-url", e.URL(),
		"--role", e.role, "--tp-size", "1", "--model-dir", s.modelDir,
		"--name", "vllm-" + e.role, "--control-plane", cp.URL,
		// vLLM's /health took over 5 s under load here.
		"--probe-timeout", "15s", "--log-level", "info"}
	args = append(args, extra...)
	p, err := bench.Start("agent-"+e.role, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, p)
	return p
}

// stopAtEnd stops p when the test ends, and shows its output when the
// test failed.
func stopAtEnd(t *testing.T, p *bench.Process) {
	t.Cleanup(func() {
		p.StopGrace(5 * time.Second)
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", p.Name, tailOf(p.Output(), 6000))
		}
	})
}

// peer is the part of GET /api/v1/peers the tests read.
type peer struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Role        string   `json:"role"`
	State       string   `json:"state"`
	StateReason string   `json:"state_reason"`
	Generation  int      `json:"generation"`
	Model       string   `json:"model"`
	Engine      string   `json:"engine"`
	InstanceID  string   `json:"instance_id"`
	Observed    []string `json:"observed"`
	Unknown     []string `json:"unknown"`
	KV          struct {
		PageSize   int    `json:"page_size"`
		Dtype      string `json:"dtype"`
		NumLayers  int    `json:"num_layers"`
		NumKVHeads int    `json:"num_kv_heads"`
		HeadDim    int    `json:"head_dim"`
	} `json:"kv"`
	Parallelism struct {
		TPSize int `json:"tp_size"`
	} `json:"parallelism"`
	Load *struct {
		Running int     `json:"running"`
		Queued  int     `json:"queued"`
		KVUsage float64 `json:"kv_usage"`
	} `json:"load"`
	Heal *struct {
		Phase string `json:"phase"`
	} `json:"heal"`
}

func (cp *controlPlane) peers(t *testing.T) map[string]peer {
	t.Helper()
	var v struct{ Peers []peer }
	getJSON(t, cp.URL+"/api/v1/peers", &v)
	m := map[string]peer{}
	for _, p := range v.Peers {
		m[p.Role] = p
	}
	return m
}

// pairState is one row of GET /api/v1/pairs.
type pairState struct {
	Compatible bool     `json:"compatible"`
	Routable   bool     `json:"routable"`
	Verified   *bool    `json:"verified"`
	Unverified []string `json:"unverified"`
	Reason     string   `json:"reason"`
	Path       string   `json:"path"`
	Preflight  *struct {
		State   string  `json:"state"`
		Backend string  `json:"backend"`
		Gbps    float64 `json:"gbps"`
		Error   string  `json:"error"`
	} `json:"preflight"`
}

func (cp *controlPlane) pairs(t *testing.T) []pairState {
	t.Helper()
	var v struct{ Pairs []pairState }
	getJSON(t, cp.URL+"/api/v1/pairs", &v)
	return v.Pairs
}

// routable reports whether the control plane has a pair to route to.
func (cp *controlPlane) routable() bool {
	resp, err := http.Get(cp.URL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

// waitFor polls cond every 200 ms until it holds or within passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// answer is one HTTP exchange's outcome.
type answer struct {
	Status      int
	ContentType string
	Body        []byte
	Header      http.Header
}

// post sends body to url and reads the whole answer, within limit.
func post(t *testing.T, url string, body any, limit time.Duration) answer {
	t.Helper()
	a, err := tryPost(t.Context(), url, body, limit)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return a
}

func tryPost(ctx context.Context, url string, body any, limit time.Duration) (answer, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return answer{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: rb, Header: resp.Header}, nil
}

// metrics reads the Prometheus page at url into series → value, the key
// the series' name and labels as the page writes them.
func metrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatalf("GET %s/metrics: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// sumSeries adds the values of every series of m named name whose labels
// contain each of labels (`key="value"`).
func sumSeries(m map[string]float64, name string, labels ...string) float64 {
	var sum float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(k, l)
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// The series a vLLM 0.32 decode counts its prompt tokens and NIXL
// transfers in (vllm/v1/metrics/loggers.py, and the NixlConnector's
// KVConnectorPromMetrics), read off the running engine.
const (
	promptTokensBySource = "vllm:prompt_tokens_by_source_total"
	sourceTransfer       = `source="external_kv_transfer"`
	sourceCompute        = `source="local_compute"`
	nixlFailedTransfers  = "vllm:nixl_num_failed_transfers_total"
	nixlBytes            = "vllm:nixl_bytes_transferred_sum"
)

// supervisor restarts an engine when asked over HTTP, the way systemd or
// a Kubernetes kubelet would for the agent's heal action: the agent's
// `--heal exec:CMD` posts to it. It counts the restarts it was asked for.
type supervisor struct {
	mu       sync.Mutex
	restarts map[string]int
	URL      string
}

func (s *suite) startSupervisor(t *testing.T) *supervisor {
	t.Helper()
	sv := &supervisor{restarts: map[string]int{}}
	engines := map[string]*vllmEngine{"prefill": s.prefill, "decode": s.decode}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /restart/{role}", func(w http.ResponseWriter, r *http.Request) {
		e := engines[r.PathValue("role")]
		if e == nil {
			http.NotFound(w, r)
			return
		}
		sv.mu.Lock()
		sv.restarts[e.role]++
		sv.mu.Unlock()
		e.stop()
		if err := e.start(context.Background(), s); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "restarted")
	})
	ln := bench.ListenFree(t)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	sv.URL = "http://" + ln.Addr().String()
	return sv
}

func (sv *supervisor) count(role string) int {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.restarts[role]
}

// healCommand is the agent's `--heal exec:` command that asks sv to
// restart the engine of role, written with the venv's python (the one
// program every machine that runs vLLM has).
func (s *suite) healCommand(sv *supervisor, role string) string {
	script := filepath.Join(s.dir, "heal-"+role+".py")
	_ = os.WriteFile(script, []byte(fmt.Sprintf(
		"import urllib.request\nurllib.request.urlopen(urllib.request.Request(%q, method='POST'), timeout=300).read()\n",
		sv.URL+"/restart/"+role)), 0o644)
	return "exec:" + s.python + " " + script
}

func tryGet(ctx context.Context, url string) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: b, Header: resp.Header}, err
}
