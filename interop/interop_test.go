package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
)

// pdplaneBin is the binary under test, built once by TestMain.
var pdplaneBin string

func TestMain(m *testing.M) {
	os.Exit(bench.RunWithPdplane("../cmd/pdplane", func(bin string) int {
		pdplaneBin = bin
		return m.Run()
	}))
}

// routerBin returns the router executable named by env, skipping the test
// when it is unset outside CI.
func routerBin(t *testing.T, env, install string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set; under CI=true the interop tests are required (make test installs it: %s)", env, install)
		}
		t.Skipf("%s is not set; %s, or run make test", env, install)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s=%s: %v", env, p, err)
	}
	return p
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := bench.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// simTransferSecret is the TCP transfer secret the sims of one test share:
// without a control plane, nothing else tells them each other's secret.
const simTransferSecret = "interop shared transfer secret"

// stopAtEnd stops p when the test ends and logs its output if the test
// failed.
func stopAtEnd(t *testing.T, p *bench.Process) {
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", p.Name, p.Output())
		}
	})
}

// start runs a process until the test ends.
func start(t *testing.T, name string, args ...string) {
	t.Helper()
	p, err := bench.Start(name, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, p)
}

// sim is a `pdplane sim` engine run alone (no control plane), as an
// operator would run it behind another router.
type sim struct{ *bench.Sim }

func startSim(t *testing.T, engine, role string) sim {
	t.Helper()
	s, err := bench.StartSim(t.Context(), pdplaneBin, bench.SimSpec{Engine: engine, Role: role, TransferSecret: simTransferSecret})
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, s.Process)
	return sim{s}
}

// waitHTTP waits until GET url answers 200.
func waitHTTP(t *testing.T, url string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	if err := bench.WaitHTTP(ctx, url, nil); err != nil {
		t.Fatal(err)
	}
}

func (s sim) stats(t *testing.T) map[string]any {
	t.Helper()
	resp, err := http.Get(s.URL + "/_sim/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func num(m map[string]any, k string) int {
	f, _ := m[k].(float64)
	return int(f)
}

// post sends one request and returns the status and the whole body.
func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", url, err)
	}
	return resp.StatusCode, b
}

// metricValue reads one unlabelled series from a Prometheus text page.
func metricValue(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", name, line, err)
			}
			return f
		}
	}
	t.Fatalf("%s has no series %s", url, name)
	return 0
}

// postUntilOK retries while the router in front is still discovering its
// workers (it answers 5xx or refuses the connection until then); within 0
// makes one try.
func postUntilOK(t *testing.T, url, body string, within time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for try := 0; try == 0 || time.Now().Before(deadline); try++ {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return b
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("POST %s never succeeded within %v (at least one try): %s", url, within, last)
	return nil
}

// completionText returns the generated text of a non-streamed OpenAI or
// SGLang-native answer.
func completionText(t *testing.T, b []byte) string {
	t.Helper()
	var v struct {
		Text    string `json:"text"`
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("answer is not JSON: %v: %s", err, b)
	}
	if v.Text != "" {
		return v.Text
	}
	if len(v.Choices) == 0 {
		t.Fatalf("answer has no choices: %s", b)
	}
	return v.Choices[0].Text + v.Choices[0].Message.Content
}

// streamText reads an SSE answer and returns the concatenated content of
// its data events and whether it ended with [DONE]. Any event carrying an
// "error" member fails the test.
func streamText(t *testing.T, b []byte) (string, bool) {
	t.Helper()
	var text strings.Builder
	done := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev struct {
			Error   json.RawMessage `json:"error"`
			Text    string          `json:"text"`
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("SSE event is not JSON: %v: %s", err, data)
		}
		if len(ev.Error) > 0 {
			t.Fatalf("SSE error event: %s", data)
		}
		if ev.Text != "" { // SGLang's /generate streams the text so far
			text.Reset()
			text.WriteString(ev.Text)
		}
		for _, c := range ev.Choices {
			text.WriteString(c.Text + c.Delta.Content)
		}
	}
	return text.String(), done
}

// request is one POST through the router under test.
type request struct{ path, body string }

// serveAll sends each request and requires a 200 with generated text; a
// streamed one must end with [DONE] and carry no error event.
func serveAll(t *testing.T, base string, reqs []request) {
	t.Helper()
	for _, c := range reqs {
		status, b := post(t, base+c.path, c.body)
		if status != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c.path, c.body, status, b)
		}
		var text string
		if strings.Contains(c.body, `"stream":true`) {
			var done bool
			text, done = streamText(t, b)
			if !done {
				t.Fatalf("%s: stream did not end with [DONE]: %s", c.path, b)
			}
		} else {
			text = completionText(t, b)
		}
		if text == "" {
			t.Fatalf("%s: no text in %s", c.path, b)
		}
	}
}

// transfers returns how many KV transfers the decode received (each P/D
// request moves its KV once), and fails on any KV byte that did not verify
// or any transfer error on either side.
func transfers(t *testing.T, p, d sim) int {
	t.Helper()
	ps, ds := p.stats(t), d.stats(t)
	for _, s := range []map[string]any{ps, ds} {
		if n := num(s, "verify_failures"); n != 0 {
			t.Fatalf("%v: %d KV verify failures", s["name"], n)
		}
		if n := num(s, "transfer_errors"); n != 0 {
			t.Fatalf("%v: %d transfer errors", s["name"], n)
		}
	}
	return num(ds, "transfers")
}

// smgArgs is SMG's command line on port, loopback only, logging warnings.
func smgArgs(t *testing.T, bin string, port int) []string {
	t.Helper()
	args, err := bench.SMGArgs(bin, port, "warn")
	if err != nil {
		t.Fatal(err)
	}
	return args
}

// TestSMGDrivesSGLangSims runs SMG in PD mode in front of a simulated SGLang
// prefill and decode, as `smg launch --pd-disaggregation --prefill URL
// BOOTSTRAP_PORT --decode URL` is run in front of real ones: SMG health-checks
// both, sends the same body with its bootstrap triple to both, and relays the
// decode's answer. Each request must move and verify real KV bytes.
func TestSMGDrivesSGLangSims(t *testing.T) {
	bin := routerBin(t, "PDPLANE_SMG", "pip install smg==1.13.0")
	p, d := startSim(t, "sglang", "prefill"), startSim(t, "sglang", "decode")
	port := freePort(t)
	args, err := bench.SMGPDArgs(bin, port, "warn", p.Sim, d.Sim)
	if err != nil {
		t.Fatal(err)
	}
	start(t, "smg", args...)
	serveMovingKV(t, "SMG", "http://127.0.0.1:"+strconv.Itoa(port), p, d, []request{
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"stream please"}],"max_tokens":8,"stream":true}`},
		{"/v1/completions", `{"model":"sim-model","prompt":"once upon a time","max_tokens":8,"stream":true}`},
		{"/generate", `{"text":"native generate","sampling_params":{"max_new_tokens":8}}`},
		{"/generate", `{"text":"native generate streamed","sampling_params":{"max_new_tokens":8},"stream":true}`},
	})
}

// serveMovingKV waits until the router named router at base answers a chat
// completion, then serves cases through it, and checks that the sims p and
// d moved KV once for each of those requests.
func serveMovingKV(t *testing.T, router, base string, p, d sim, cases []request) {
	t.Helper()
	before := transfers(t, p, d)
	chat := `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`
	if got := completionText(t, postUntilOK(t, base+"/v1/chat/completions", chat, 60*time.Second)); got == "" {
		t.Fatal("empty chat completion")
	}
	serveAll(t, base, cases)
	if got, want := transfers(t, p, d)-before, 1+len(cases); got != want {
		t.Fatalf("sims counted %d KV transfers for %d requests through %s", got, want, router)
	}
}

// TestVLLMRouterDrivesVLLMSims runs vllm-router in PD mode
// (`--vllm-pd-disaggregation --prefill URL --decode URL`) in front of a
// simulated vLLM prefill and decode: the router sends the prefill a
// max_tokens=1 request with kv_transfer_params, then the decode the original
// request with the prefill's kv_transfer_params. Each request must move and
// verify real KV bytes.
func TestVLLMRouterDrivesVLLMSims(t *testing.T) {
	bin := routerBin(t, "PDPLANE_VLLM_ROUTER", "pip install vllm-router==0.1.17")
	p, d := startSim(t, "vllm", "prefill"), startSim(t, "vllm", "decode")
	port := freePort(t)
	args, err := bench.VLLMRouterPDArgs(bin, port, "warning", p.Sim, d.Sim)
	if err != nil {
		t.Fatal(err)
	}
	start(t, "vllm-router", args...)
	serveMovingKV(t, "vllm-router", "http://127.0.0.1:"+strconv.Itoa(port), p, d, []request{
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"stream please"}],"max_tokens":8,"stream":true}`},
		{"/v1/completions", `{"model":"sim-model","prompt":"once upon a time","max_tokens":8}`},
		{"/v1/completions", `{"model":"sim-model","prompt":"once upon a time","max_tokens":8,"stream":true}`},
	})
}

// TestPdplaneBehindSMG puts a whole pdplane (`pdplane dev`: control plane,
// router, a simulated prefill and decode) behind SMG as one regular worker,
// the way an operator adds pdplane to an existing SMG. SMG identifies the
// worker by /server_info and reads its model from /server_info and
// /model_info; it must see an SGLang worker serving sim-model and route
// chat completions through it.
func TestPdplaneBehindSMG(t *testing.T) {
	bin := routerBin(t, "PDPLANE_SMG", "pip install smg==1.13.0")
	devPort := freePort(t)
	dev := "http://127.0.0.1:" + strconv.Itoa(devPort)
	// A decode slow enough (150 ms a token) that pdplane takes each stream
	// off net/http's connection (router/takeover.go): SMG's own HTTP client
	// (hyper) reads the chunked answers pdplane then writes itself, one
	// request after another. (That the next request may go on a handed-back
	// connection is shown with Go's client in router/takeover_test.go; how
	// hyper pools its connections is not counted here.)
	start(t, "pdplane dev", pdplaneBin, "dev", "--addr", strings.TrimPrefix(dev, "http://"), "--decode-time-per-token", "150ms")
	waitHTTP(t, dev+"/readyz", 60*time.Second)

	port := freePort(t)
	start(t, "smg", append(smgArgs(t, bin, port), "--worker-urls", dev)...)
	base := "http://127.0.0.1:" + strconv.Itoa(port)

	chat := `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}`
	text, done := streamText(t, postUntilOK(t, base+"/v1/chat/completions", chat, 60*time.Second))
	if text == "" || !done {
		t.Fatalf("streamed chat through SMG and pdplane: text %q, [DONE] %v", text, done)
	}
	for i := range 3 {
		// One try each: a connection pdplane failed to keep would fail it.
		again, done := streamText(t, postUntilOK(t, base+"/v1/chat/completions", chat, 0))
		if again != text || !done {
			t.Fatalf("streamed chat %d through SMG and pdplane: text %q, [DONE] %v; want %q as the first", i+2, again, done, text)
		}
	}
	if n := metricValue(t, dev+"/metrics", "pdplane_router_streams_taken_over_total"); n < 4 {
		t.Fatalf("pdplane took %v of the 4 streams off net/http's connection, want all", n)
	}

	resp, err := http.Get(base + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("SMG /workers: %d %s", resp.StatusCode, b)
	}
	var workers struct {
		Workers []struct {
			URL         string `json:"url"`
			ModelID     string `json:"model_id"`
			RuntimeType string `json:"runtime_type"`
			IsHealthy   bool   `json:"is_healthy"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(b, &workers); err != nil {
		t.Fatalf("SMG /workers: %v: %s", err, b)
	}
	if len(workers.Workers) != 1 {
		t.Fatalf("SMG lists %d workers, want pdplane alone: %s", len(workers.Workers), b)
	}
	w := workers.Workers[0]
	if w.URL != dev || w.ModelID != "sim-model" || w.RuntimeType != "sglang" || !w.IsHealthy {
		t.Fatalf("SMG sees pdplane as %+v, want a healthy sglang worker at %s serving sim-model", w, dev)
	}
}
