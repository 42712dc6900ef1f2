package realengine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/kvevents"
	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim/simtest"
)

// shared is the suite TestMain set up; nil with skipReason when the venv
// is missing outside CI.
var (
	shared     *suite
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	python := os.Getenv("PDPLANE_VLLM_PYTHON")
	if python == "" {
		msg := "PDPLANE_VLLM_PYTHON is not set: run scripts/install-vllm.sh (make test does) and export the python it prints"
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "realengine: "+msg+"; under CI=true the real-engine suite is required")
			return 1
		}
		skipReason = msg
		return m.Run()
	}
	return bench.RunWithPdplane("../cmd/pdplane", func(bin string) int {
		s, stop, err := newSuite(bin, python)
		if err != nil {
			fmt.Fprintln(os.Stderr, "realengine:", err)
			return 1
		}
		defer stop()
		shared = s
		return m.Run()
	})
}

// newSuite builds the model and starts the two engines, at once.
func newSuite(bin, python string) (*suite, func(), error) {
	dir, err := os.MkdirTemp("", "pdplane-realengine-")
	if err != nil {
		return nil, nil, err
	}
	modelDir := os.Getenv("PDPLANE_TINY_MODEL_DIR")
	if modelDir == "" {
		modelDir = filepath.Join("..", ".tmp", "tiny-model")
	}
	if modelDir, err = filepath.Abs(modelDir); err != nil {
		return nil, nil, err
	}
	if err := buildModel(python, modelDir); err != nil {
		return nil, nil, err
	}
	ports := make([]int, 6)
	for i := range ports {
		if ports[i], err = bench.FreePort(); err != nil {
			return nil, nil, err
		}
	}
	s := &suite{bin: bin, python: python, modelDir: modelDir, dir: dir,
		prefill: &vllmEngine{role: "prefill", port: ports[0], sidePort: ports[1], engineID: "pdplane-prefill-a",
			eventsPort: ports[4], replayPort: ports[5]},
		decode: &vllmEngine{role: "decode", port: ports[2], sidePort: ports[3]},
		dbURL:  os.Getenv("PDPLANE_TEST_DATABASE_URL"),
	}
	stop := func() {
		s.prefill.stop()
		s.decode.stop()
		_ = os.RemoveAll(dir)
	}
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, e := range []*vllmEngine{s.prefill, s.decode} {
		wg.Go(func() { errs[i] = e.start(context.Background(), s) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			stop()
			return nil, nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "realengine: vLLM prefill %s and decode %s up in %v\n", s.prefill.URL(), s.decode.URL(), time.Since(start).Round(time.Second))
	return s, stop, nil
}

func needSuite(t *testing.T) *suite {
	t.Helper()
	if shared == nil {
		t.Skip(skipReason)
	}
	t.Cleanup(func() {
		if t.Failed() { // what the engines said is most of what explains a failure
			for _, e := range []*vllmEngine{shared.prefill, shared.decode} {
				if e.p != nil {
					t.Logf("--- %s output (its end) ---\n%s", e.p.Name, tailOf(e.p.Output(), 30000))
				}
			}
		}
	})
	return shared
}

// chatBody is a chat completion request for the tiny model.
func chatBody(content string, maxTokens int, stream bool) map[string]any {
	return map[string]any{"model": servedModel, "messages": []map[string]any{{"role": "user", "content": content}},
		"max_tokens": maxTokens, "temperature": 0, "stream": stream}
}

func completionBody(prompt string, maxTokens int, stream bool) map[string]any {
	return map[string]any{"model": servedModel, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "stream": stream}
}

// promptTokens reads usage.prompt_tokens of a non-streamed answer.
func promptTokens(t *testing.T, a answer) int {
	t.Helper()
	var v struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(a.Body, &v); err != nil || v.Usage.PromptTokens == 0 {
		t.Fatalf("no usage.prompt_tokens in %s (%v)", a.Body, err)
	}
	return v.Usage.PromptTokens
}

// blockSize is the engines' KV block (page) size: vLLM's default on CPU.
const blockSize = 128

// cachedTokens is usage.prompt_tokens_details.cached_tokens of an answer.
func cachedTokens(t *testing.T, a answer) int {
	t.Helper()
	var v struct {
		Usage struct {
			Details *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(a.Body, &v); err != nil || v.Usage.Details == nil {
		t.Fatalf("no usage.prompt_tokens_details in %s (%v)", a.Body, err)
	}
	return v.Usage.Details.CachedTokens
}

func completionText(t *testing.T, a answer) string {
	t.Helper()
	var v struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(a.Body, &v); err != nil || len(v.Choices) != 1 {
		t.Fatalf("not a completion: %s (%v)", a.Body, err)
	}
	return v.Choices[0].Text
}

// wantOK fails the test unless a is a 200 of media type mt.
func wantOK(t *testing.T, what string, a answer, mt string) {
	t.Helper()
	if a.Status != 200 || !strings.HasPrefix(a.ContentType, mt) {
		t.Fatalf("%s: %d %q: %s", what, a.Status, a.ContentType, a.Body)
	}
}

// wantSSE checks a streamed answer's framing: every event a JSON object
// on one data line, and [DONE] last. It returns the events.
func wantSSE(t *testing.T, what string, a answer) []map[string]any {
	t.Helper()
	wantOK(t, what, a, "text/event-stream")
	events, done := simtest.Events(a.Body)
	if !done || len(events) == 0 {
		t.Fatalf("%s: %d events, [DONE] %v: %s", what, len(events), done, a.Body)
	}
	out := make([]map[string]any, len(events))
	for i, e := range events {
		if err := json.Unmarshal(e, &out[i]); err != nil {
			t.Fatalf("%s: event %d is not a JSON object: %s", what, i, e)
		}
		if _, ok := out[i]["error"]; ok {
			t.Fatalf("%s: error event %s", what, e)
		}
	}
	return out
}

// TestVLLM runs pdplane in front of the real vLLM pair. Its parts run in
// order and share the engines: later ones kill and restart them.
func TestVLLM(t *testing.T) {
	s := needSuite(t)
	t.Run("embedded-store", s.testEmbeddedStore)
	if s.dbURL == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PDPLANE_TEST_DATABASE_URL is not set; under CI=true the suite runs on PostgreSQL too")
		}
		t.Log("PDPLANE_TEST_DATABASE_URL is not set: the rest of the suite runs on the embedded store")
	}
	dbURL := s.dbURL
	if dbURL != "" {
		// A schema of its own: nothing an earlier run left in the database
		// (peers whose leases still run) takes part.
		dbURL, _ = registrytest.NewSchema(t)
	}
	sv := s.startSupervisor(t)
	cp := s.startControlPlane(t, dbURL, "--route-receipt", "--prefill-policy", "precise")
	s.startAgent(t, cp, s.prefill, "--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", s.prefill.eventsPort),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", s.prefill.replayPort), "--kv-events-topic", kvEventsTopic)
	s.startAgent(t, cp, s.decode, "--heal", s.healCommand(sv, "decode"))
	waitFor(t, "a routable pair", 60*time.Second, cp.routable)

	steps := []struct {
		name string
		run  func(*testing.T, *controlPlane, *supervisor)
	}{
		{"routes", s.testRoutes},
		{"kv-moves", s.testKVMoves},
		{"kv-events", s.testKVEvents},
		{"precise-routing", s.testPreciseRouting},
		{"load-under-concurrency", s.testLoad},
		{"killed-decode", s.testKilledDecode},
		{"killed-prefill", s.testKilledPrefill},
		{"heal-restarts-the-decode", s.testHeal},
	}
	for _, st := range steps {
		if !t.Run(st.name, func(t *testing.T) { st.run(t, cp, sv) }) {
			// The later steps kill and restart engines on the state the
			// earlier ones leave: stop at the first that failed.
			return
		}
	}
}

// testEmbeddedStore: both engines register through their agents from
// what vLLM publishes, on the embedded store; the pair is compatible and
// names what it could not verify; a chat completion goes through; and the
// agents' pair preflight beside the real engines (NIXL, DRAM, UCX over
// tcp) passes with a rate. These agents end with the step: each one's
// NIXL progress thread spins a core, which the engines need for the rest.
func (s *suite) testEmbeddedStore(t *testing.T) {
	cp := s.startControlPlane(t, "")
	preflight := []string{"--preflight", "nixl", "--preflight-ucx-tls", "tcp", "--preflight-poll", "1s", "--preflight-gap", "100ms"}
	s.startAgent(t, cp, s.prefill, preflight...)
	s.startAgent(t, cp, s.decode, preflight...)
	waitFor(t, "a routable pair", 60*time.Second, cp.routable)
	s.checkRegistered(t, cp)
	a := post(t, cp.URL+"/v1/chat/completions", chatBody("hello world", 4, false), 60*time.Second)
	wantOK(t, "chat", a, "application/json")
	s.checkPreflight(t, cp)
}

func (s *suite) checkRegistered(t *testing.T, cp *controlPlane) {
	t.Helper()
	peers := cp.peers(t)
	for _, role := range []string{"prefill", "decode"} {
		p, ok := peers[role]
		if !ok {
			t.Fatalf("no %s registered: %v", role, peers)
		}
		if p.Engine != "vllm" || p.Model != servedModel || p.State != "ready" || p.Parallelism.TPSize != 1 {
			t.Errorf("%s: %+v", role, p)
		}
		// From vLLM's /metrics (cache_config_info, process start time),
		// /v1/models and the model's config.json: the CPU build's block
		// size is 128 and the tiny model is 2 layers × 2 KV heads × 64.
		if p.KV.PageSize != blockSize || p.KV.Dtype != "float32" || p.KV.NumLayers != 2 || p.KV.NumKVHeads != 2 || p.KV.HeadDim != 64 {
			t.Errorf("%s: kv %+v", role, p.KV)
		}
		for _, f := range []string{"model", "kv.page_size", "kv.dtype", "instance_id", "kv.num_layers", "kv.num_kv_heads", "kv.head_dim"} {
			if !slices.Contains(p.Observed, f) {
				t.Errorf("%s: %s not observed: %v", role, f, p.Observed)
			}
		}
		if !slices.Contains(p.Unknown, "ranks") {
			t.Errorf("%s: ranks should be unknown (vLLM publishes no NIXL agents): %v", role, p.Unknown)
		}
	}
	pairs := cp.pairs(t)
	if len(pairs) != 1 {
		t.Fatalf("%d pairs, want 1", len(pairs))
	}
	pr := pairs[0]
	if !pr.Compatible || !pr.Routable || pr.Verified == nil || *pr.Verified || !slices.Contains(pr.Unverified, "ranks[*].kv_mem_kinds") {
		t.Errorf("pair: %+v", pr)
	}
}

// testRoutes: every OpenAI route through pdplane, unary and streamed, the
// OpenAI Python SDK, /v1/models, and vLLM's own 400 passed on unretried.
func (s *suite) testRoutes(t *testing.T, cp *controlPlane, _ *supervisor) {
	s.checkRegistered(t, cp)
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	getJSON(t, cp.URL+"/v1/models", &models)
	if len(models.Data) != 1 || models.Data[0].ID != servedModel {
		t.Errorf("/v1/models: %+v", models)
	}

	wantOK(t, "chat", post(t, cp.URL+"/v1/chat/completions", chatBody("hello world the router", 8, false), 60*time.Second), "application/json")
	wantOK(t, "completion", post(t, cp.URL+"/v1/completions", completionBody("the prefill sends the decode", 8, false), 60*time.Second), "application/json")
	ev := wantSSE(t, "streamed chat", post(t, cp.URL+"/v1/chat/completions", chatBody("hello world the router", 8, true), 60*time.Second))
	if ev[0]["object"] != "chat.completion.chunk" {
		t.Errorf("streamed chat: first event %v", ev[0])
	}
	ev = wantSSE(t, "streamed completion", post(t, cp.URL+"/v1/completions", completionBody("the prefill sends the decode", 8, true), 60*time.Second))
	if ev[0]["object"] != "text_completion" {
		t.Errorf("streamed completion: first event %v", ev[0])
	}

	sdk := exec.CommandContext(t.Context(), s.python, "-c", openAISDKScript, cp.URL+"/v1", servedModel)
	if out, err := sdk.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("sdk ok")) {
		t.Errorf("OpenAI Python SDK through pdplane: %v\n%s", err, out)
	}

	// A prompt longer than --max-model-len: vLLM's prefill refuses it with
	// its own 400, which reaches the client as vLLM wrote it, after one
	// attempt.
	before := metrics(t, cp.URL)
	long := strings.Repeat("hello world ", maxModelLen)
	direct := post(t, s.prefill.URL()+"/v1/completions", completionBody(long, 4, false), 60*time.Second)
	routed := post(t, cp.URL+"/v1/completions", completionBody(long, 4, false), 60*time.Second)
	if direct.Status != 400 || routed.Status != 400 || !strings.Contains(string(routed.Body), "maximum context length") {
		t.Fatalf("over-long prompt: engine %d %s; pdplane %d %s", direct.Status, direct.Body, routed.Status, routed.Body)
	}
	var de, re struct {
		Error struct{ Message, Type string }
	}
	_ = json.Unmarshal(direct.Body, &de)
	_ = json.Unmarshal(routed.Body, &re)
	if de.Error != re.Error {
		t.Errorf("pdplane changed vLLM's error: engine %+v, pdplane %+v", de.Error, re.Error)
	}
	after := metrics(t, cp.URL)
	if d := sumSeries(after, "pdplane_router_retries_total") - sumSeries(before, "pdplane_router_retries_total"); d != 0 {
		t.Errorf("vLLM's 400 was retried %v times", d)
	}
	if d := sumSeries(after, "pdplane_router_prefill_duration_seconds_count") - sumSeries(before, "pdplane_router_prefill_duration_seconds_count"); d != 1 {
		t.Errorf("vLLM's 400 took %v prefill attempts, want 1", d)
	}
}

// openAISDKScript runs a chat completion and a streamed one with the
// OpenAI Python SDK against argv[1].
const openAISDKScript = `
import sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="none", timeout=120)
r = c.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0)
assert r.choices[0].finish_reason in ("length", "stop"), r
assert r.usage.prompt_tokens > 0, r
n = 0
for ch in c.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0, stream=True):
    n += 1
assert n >= 4, n
r = c.completions.create(model=sys.argv[2], prompt="hello world", max_tokens=4, temperature=0)
assert r.choices[0].text is not None, r
print("sdk ok")
`

// testKVMoves: the decode's own metrics count the prompt tokens of the
// requests pdplane routed as received by KV transfer and none as computed
// locally, no NIXL transfer failed, and greedy output through pdplane is
// the prefill engine's own. An agent's probe reads the same counters as
// prompt tokens loaded, none recomputed.
func (s *suite) testKVMoves(t *testing.T, cp *controlPlane, _ *supervisor) {
	probe, err := agent.NewEngineProbe(agent.ProbeConfig{RecomputeWindow: time.Hour}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	probe.Probe(t.Context(), s.decode.URL(), registry.EngineVLLM)
	before := metrics(t, s.decode.URL())
	prompts := []string{
		"the prefill engine sends the decode a block of memory",
		"one two three four five six seven eight nine ten",
		strings.Repeat("the router picks a pair for the fleet ", 30), // > one 128-token block
	}
	sent, blocks := 0, 0
	routerBefore := metrics(t, cp.URL)
	for _, p := range prompts {
		routed := post(t, cp.URL+"/v1/completions", completionBody(p, 8, false), 60*time.Second)
		wantOK(t, "completion", routed, "application/json")
		n := promptTokens(t, routed)
		sent += n
		// vLLM 0.32's usage (--enable-prompt-tokens-details) counts
		// none of the tokens its decode loaded by KV transfer as cached:
		// an answer cannot tell a loaded prompt from a recomputed one,
		// so only the decode's counters can (the agent's probe, below).
		if c := cachedTokens(t, routed); c != 0 {
			t.Errorf("decode's usage: %d cached of %d prompt tokens loaded by KV transfer; vLLM 0.32 said 0 (%s)", c, n, routed.Body)
		}
		// The receipt counts the blocks the prefill handed the decode.
		m := regexp.MustCompile(` kv_blocks=(\d+)`).FindStringSubmatch(routed.Header.Get(router.RouteReceiptHeader))
		if m == nil {
			t.Fatalf("route receipt %q gives no kv_blocks", routed.Header.Get(router.RouteReceiptHeader))
		}
		b, _ := strconv.Atoi(m[1])
		if want := (n + blockSize - 1) / blockSize; b != want {
			t.Errorf("route receipt %q: %d blocks for a %d-token prompt, want %d", routed.Header.Get(router.RouteReceiptHeader), b, n, want)
		}
		blocks += b
		// Greedy: the prefill engine alone, asked the same, answers the same.
		local := post(t, s.prefill.URL()+"/v1/completions", completionBody(p, 8, false), 60*time.Second)
		wantOK(t, "prefill alone", local, "application/json")
		if got, want := completionText(t, routed), completionText(t, local); got != want {
			t.Errorf("greedy output through pdplane %q, the prefill's own %q", got, want)
		}
	}
	routerAfter := metrics(t, cp.URL)
	delta := func(name string) float64 { return sumSeries(routerAfter, name) - sumSeries(routerBefore, name) }
	if got := delta("pdplane_router_pair_kv_blocks_total"); got != float64(blocks) {
		t.Errorf("the router's pair counter reads %v KV blocks, the receipts %d", got, blocks)
	}
	t.Logf("route receipts: %d KV blocks for %d prompt tokens", blocks, sent)
	after := metrics(t, s.decode.URL())
	moved := sumSeries(after, promptTokensBySource, sourceTransfer) - sumSeries(before, promptTokensBySource, sourceTransfer)
	computed := sumSeries(after, promptTokensBySource, sourceCompute) - sumSeries(before, promptTokensBySource, sourceCompute)
	failed := sumSeries(after, nixlFailedTransfers) - sumSeries(before, nixlFailedTransfers)
	bytesMoved := sumSeries(after, nixlBytes) - sumSeries(before, nixlBytes)
	t.Logf("decode: %v prompt tokens by KV transfer, %v computed, %v NIXL bytes, %v failed transfers; %d prompt tokens sent",
		moved, computed, bytesMoved, failed, sent)
	// vLLM computes a prompt's last token on the decode when the prefill's
	// KV covers all but it; it counts what the connector loaded.
	if moved < float64(sent-len(prompts)) || computed > float64(len(prompts)) || failed != 0 || bytesMoved <= 0 {
		t.Errorf("the decode's metrics do not show the KV moved: %v by transfer, %v computed (of %d sent), %v NIXL bytes, %v failed",
			moved, computed, sent, bytesMoved, failed)
	}
	st := probe.Probe(t.Context(), s.decode.URL(), registry.EngineVLLM)
	t.Logf("the agent's probe reads: %s", st.Recompute)
	if st.Recompute.Prompt != int64(moved+computed) || st.Recompute.Recomputed != 0 || st.Recomputing {
		t.Errorf("the agent's probe reads %+v (recomputing %v) of the decode, want %v prompt tokens, none recomputed",
			st.Recompute, st.Recomputing, moved+computed)
	}
}

// testKVEvents: the prefill publishes its prefix cache's KV events
// (--kv-events-config, ZMQ); kvevents reads them, replay included. A
// prompt of three blocks and a part is stored as three blocks whose token
// IDs are the prompt's own (vLLM's /tokenize), chained by their hashes; a
// second subscriber, from sequence 0, gets the same batches from the
// replay socket.
func (s *suite) testKVEvents(t *testing.T, cp *controlPlane, _ *supervisor) {
	cfg := kvevents.Config{Endpoint: fmt.Sprintf("127.0.0.1:%d", s.prefill.eventsPort),
		ReplayEndpoint: fmt.Sprintf("127.0.0.1:%d", s.prefill.replayPort), Topic: kvEventsTopic}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stored := make(chan kvevents.Event, 1024)
	var missed atomic.Uint64
	streamErr := make(chan error, 1)
	go func() {
		_, err := kvevents.Stream(ctx, cfg, 0, func(m kvevents.Message) {
			missed.Add(m.Missed)
			for _, e := range m.Batch.Events {
				if e.Kind == kvevents.BlockStored {
					select {
					case stored <- e:
					default: // the test stopped reading
					}
				}
			}
		})
		streamErr <- err
	}()
	defer func() {
		cancel()
		if err := <-streamErr; err != nil {
			t.Errorf("KV events: %v", err)
		}
	}()
	prompt := strings.Repeat("a router reads the engines' own prefix caches ", 20)
	var tok struct {
		Tokens []int32 `json:"tokens"`
	}
	tr := post(t, s.prefill.URL()+"/tokenize", map[string]any{"model": servedModel, "prompt": prompt}, 30*time.Second)
	if err := json.Unmarshal(tr.Body, &tok); err != nil || len(tok.Tokens) < 2*blockSize {
		t.Fatalf("tokenize: %d tokens, %v (%s)", len(tok.Tokens), err, tr.Body)
	}
	// Routed: the prefill computes the prompt and caches its full blocks.
	wantOK(t, "completion", post(t, cp.URL+"/v1/completions", completionBody(prompt, 4, false), 60*time.Second), "application/json")
	full := len(tok.Tokens) / blockSize
	var got []int32
	var hashes []kvevents.Hash
	deadline := time.After(30 * time.Second)
	for len(got) < full*blockSize {
		select {
		case e := <-stored:
			if len(got) == 0 && (len(e.TokenIDs) == 0 || e.TokenIDs[0] != tok.Tokens[0]) {
				continue // another prompt's blocks
			}
			if len(hashes) > 0 && e.ParentHash != hashes[len(hashes)-1] {
				t.Errorf("a stored event's parent %x is not the previous block %x", e.ParentHash, hashes[len(hashes)-1])
			}
			got, hashes = append(got, e.TokenIDs...), append(hashes, e.BlockHashes...)
		case err := <-streamErr:
			streamErr <- err
			t.Fatalf("the KV events stream ended: %v", err)
		case <-deadline:
			t.Fatalf("stored %d of the prompt's %d full blocks' tokens within 30 s", len(got), full*blockSize)
		}
	}
	if !slices.Equal(got[:full*blockSize], tok.Tokens[:full*blockSize]) || len(hashes) < full {
		t.Fatalf("the stored blocks' tokens are not the prompt's: %d tokens, %d hashes", len(got), len(hashes))
	}
	t.Logf("KV events: %d tokens, %d stored blocks of %d (%d bytes a hash), %d batches missed", len(tok.Tokens), len(hashes), blockSize, len(hashes[0]), missed.Load())
	if missed.Load() != 0 {
		t.Errorf("%d batches missed on loopback", missed.Load())
	}
	// A late subscriber replays what the engine holds from sequence 0.
	var replayed atomic.Int64
	rctx, rcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer rcancel()
	go func() {
		_, _ = kvevents.Stream(rctx, cfg, 0, func(m kvevents.Message) {
			for _, e := range m.Batch.Events {
				if e.Kind == kvevents.BlockStored && slices.Contains(e.BlockHashes, hashes[0]) {
					replayed.Add(1)
					rcancel()
				}
			}
		})
	}()
	<-rctx.Done()
	if replayed.Load() == 0 {
		t.Error("a subscriber from sequence 0 was not replayed the prompt's first block")
	}
}

// testPreciseRouting: the control plane routes prefills by the prompt
// blocks each holds (--prefill-policy precise), as the prefill's own KV
// events tell every router replica. A prompt that shares its first blocks
// with one routed before is routed with those blocks held (the route
// receipt's held_tokens, from the router's index and its tokenization by
// the engine's /tokenize), and vLLM's own prefix cache agrees: its hits
// rise by exactly as many tokens.
func (s *suite) testPreciseRouting(t *testing.T, cp *controlPlane, _ *supervisor) {
	shared := strings.Repeat("every prefill keeps the blocks it has computed ", 12) // some 330 tokens: two full blocks, under the 512 of the model
	first, second := shared+"and the first question is which", shared+"but the second asks another thing"
	tokens := func(prompt string) []int32 {
		var tok struct {
			Tokens []int32 `json:"tokens"`
		}
		tr := post(t, s.prefill.URL()+"/tokenize", map[string]any{"model": servedModel, "prompt": prompt}, 30*time.Second)
		if err := json.Unmarshal(tr.Body, &tok); err != nil {
			t.Fatalf("tokenize: %v (%s)", err, tr.Body)
		}
		return tok.Tokens
	}
	a, b := tokens(first), tokens(second)
	common := 0
	for common < min(len(a), len(b)) && a[common] == b[common] {
		common++
	}
	wantHeld := common / blockSize * blockSize
	if wantHeld < 2*blockSize {
		t.Fatalf("the prompts share %d tokens: fewer than two blocks", common)
	}
	heldOf := func(ans answer) (held, of int) {
		m := regexp.MustCompile(` held_tokens=(\d+)/(\d+)`).FindStringSubmatch(ans.Header.Get(router.RouteReceiptHeader))
		if m == nil {
			t.Fatalf("route receipt %q says nothing of the held tokens", ans.Header.Get(router.RouteReceiptHeader))
		}
		held, _ = strconv.Atoi(m[1])
		of, _ = strconv.Atoi(m[2])
		return held, of
	}
	ans := post(t, cp.URL+"/v1/completions", completionBody(first, 4, false), 60*time.Second)
	wantOK(t, "first completion", ans, "application/json")
	if _, of := heldOf(ans); of != len(a) {
		t.Errorf("the router tokenized the first prompt as %d tokens, the engine as %d", of, len(a))
	}
	// The router's index learns the first prompt's blocks from the events.
	waitFor(t, "the router's index to hold the first prompt's blocks", 30*time.Second, func() bool {
		return sumSeries(metrics(t, cp.URL), "pdplane_router_kv_index_blocks") >= float64(len(a)/blockSize)
	})
	before := metrics(t, s.prefill.URL())
	ans = post(t, cp.URL+"/v1/completions", completionBody(second, 4, false), 60*time.Second)
	wantOK(t, "second completion", ans, "application/json")
	held, of := heldOf(ans)
	after := metrics(t, s.prefill.URL())
	hits := sumSeries(after, "vllm:prefix_cache_hits_total") - sumSeries(before, "vllm:prefix_cache_hits_total")
	queries := sumSeries(after, "vllm:prefix_cache_queries_total") - sumSeries(before, "vllm:prefix_cache_queries_total")
	t.Logf("second prompt: the router expected %d of %d tokens held (%d shared); the prefill's prefix cache hit %v of %v queried",
		held, of, common, hits, queries)
	if held != wantHeld || of != len(b) {
		t.Errorf("route receipt: %d of %d tokens held, want %d of %d", held, of, wantHeld, len(b))
	}
	if hits != float64(held) || queries != float64(len(b)) {
		t.Errorf("vLLM's prefix cache hit %v of %v queried tokens; the router's index said %d of %d", hits, queries, held, of)
	}

	// A chat is tokenized by vLLM's /tokenize with its messages (the
	// model's chat template): the blocks the router expects held for a
	// second turn under the same system message are those vLLM's prefix
	// cache hits.
	system := strings.Repeat("the system message every turn of this chat repeats ", 9)
	chat := func(user string) map[string]any {
		return map[string]any{"model": servedModel, "max_tokens": 4,
			"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}}
	}
	batches := func() float64 { return sumSeries(metrics(t, cp.URL), "pdplane_router_kv_events_batches_total") }
	applied := batches()
	ans = post(t, cp.URL+"/v1/chat/completions", chat("what is held?"), 60*time.Second)
	wantOK(t, "first chat", ans, "application/json")
	waitFor(t, "the first chat's blocks indexed", 30*time.Second, func() bool { return batches() > applied })
	before = metrics(t, s.prefill.URL())
	ans = post(t, cp.URL+"/v1/chat/completions", chat("and what is routed?"), 60*time.Second)
	wantOK(t, "second chat", ans, "application/json")
	held, of = heldOf(ans)
	after = metrics(t, s.prefill.URL())
	hits = sumSeries(after, "vllm:prefix_cache_hits_total") - sumSeries(before, "vllm:prefix_cache_hits_total")
	queries = sumSeries(after, "vllm:prefix_cache_queries_total") - sumSeries(before, "vllm:prefix_cache_queries_total")
	t.Logf("second chat: the router expected %d of %d tokens held; the prefill's prefix cache hit %v of %v queried", held, of, hits, queries)
	if held < 2*blockSize || hits != float64(held) || queries != float64(of) {
		t.Errorf("second chat: the router expected %d of %d tokens held, vLLM's prefix cache hit %v of %v; want the same, two blocks at least",
			held, of, hits, queries)
	}
}

// testLoad: 12 requests at once all succeed, and the load the agents
// read from the engines' /metrics moves meanwhile.
func (s *suite) testLoad(t *testing.T, cp *controlPlane, _ *supervisor) {
	const n = 12
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var seen sync.Map
	go func() {
		for ctx.Err() == nil {
			var v struct{ Peers []peer }
			if b, err := httpGet(ctx, cp.URL+"/api/v1/peers"); err == nil && json.Unmarshal(b, &v) == nil {
				for _, p := range v.Peers {
					if p.Load != nil && p.Load.Running+p.Load.Queued > 0 {
						seen.Store(p.Role, p.Load.Running+p.Load.Queued)
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a, err := tryPost(t.Context(), cp.URL+"/v1/chat/completions", chatBody(fmt.Sprintf("request %d of the load", i), 96, i%2 == 0), 3*time.Minute)
			if err == nil && a.Status != 200 {
				err = fmt.Errorf("%d %s", a.Status, a.Body)
			}
			errs <- err
		})
	}
	wg.Wait()
	cancel()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("request under load: %v", err)
		}
	}
	loaded := 0
	seen.Range(func(k, v any) bool { t.Logf("%s load seen: %v requests", k, v); loaded++; return true })
	if loaded == 0 {
		t.Error("no engine's load (running + queued, from its /metrics) moved while 12 requests ran")
	}
}

// checkPreflight: the agents' pair preflight passes and gives a rate.
func (s *suite) checkPreflight(t *testing.T, cp *controlPlane) {
	waitFor(t, "a passed preflight", 90*time.Second, func() bool {
		ps := cp.pairs(t)
		return len(ps) == 1 && ps[0].Preflight != nil && ps[0].Preflight.State == "passed"
	})
	pf := cp.pairs(t)[0].Preflight
	t.Logf("preflight %+v", *pf)
	if pf.Backend != "nixl" || pf.Gbps <= 0 {
		t.Errorf("preflight: %+v", *pf)
	}
}

// testKilledDecode: a killed decode leaves routing (503 no_route while it
// is the only one) and returns at generation + 1 after a restart.
func (s *suite) testKilledDecode(t *testing.T, cp *controlPlane, _ *supervisor) {
	s.killAndRestart(t, cp, s.decode, "")
}

// testKilledPrefill: the same for the prefill, restarted under a new
// engine_id (vLLM's decode then drops the old one's NIXL state:
// _track_remote_engine_replacement).
func (s *suite) testKilledPrefill(t *testing.T, cp *controlPlane, _ *supervisor) {
	s.killAndRestart(t, cp, s.prefill, "pdplane-prefill-b")
}

func (s *suite) killAndRestart(t *testing.T, cp *controlPlane, e *vllmEngine, engineID string) {
	gen := cp.peers(t)[e.role].Generation
	e.kill()
	waitFor(t, e.role+" unhealthy", 30*time.Second, func() bool { return cp.peers(t)[e.role].State == "unhealthy" })
	// The store says so before the router's snapshot does (/readyz reads
	// the snapshot): a request in between is the router's 502, not 503.
	waitFor(t, "no routable pair", 30*time.Second, func() bool { return !cp.routable() })
	a := post(t, cp.URL+"/v1/chat/completions", chatBody("hello", 4, false), 30*time.Second)
	if a.Status != 503 || !strings.Contains(string(a.Body), "no_route") {
		t.Errorf("with the %s down: %d %s, want 503 no_route", e.role, a.Status, a.Body)
	}
	if engineID != "" {
		e.engineID = engineID
	}
	if err := e.start(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	waitFor(t, e.role+" back at the next generation", 60*time.Second, func() bool {
		p := cp.peers(t)[e.role]
		return p.Generation == gen+1 && p.State == "ready"
	})
	waitFor(t, "a routable pair", 30*time.Second, cp.routable)
	wantOK(t, "chat after the restart", post(t, cp.URL+"/v1/chat/completions", chatBody("hello again", 4, false), 120*time.Second), "application/json")
}

// testHeal: a real pair failure that only the decode's restart cures,
// and the heal plan that restarts it, once. A prefill restarted under the
// engine_id it had leaves the decode holding the old NIXL agent for that
// id: every KV load fails (NIXL_ERR_REMOTE_DISCONNECT; vLLM answers 500
// under kv_load_failure_policy=fail) until the decode restarts. pdplane
// reports the failed pair, the registry marks the decode stale (no other
// prefill can use it), the agent runs --heal exec:..., the supervisor
// restarts the engine, and the new instance is ready at generation + 1.
func (s *suite) testHeal(t *testing.T, cp *controlPlane, sv *supervisor) {
	peers := cp.peers(t)
	decodeGen := peers["decode"].Generation
	s.prefill.stop()
	if err := s.prefill.start(t.Context(), s); err != nil { // the same engine_id
		t.Fatal(err)
	}
	waitFor(t, "the prefill back", 60*time.Second, func() bool {
		p := cp.peers(t)["prefill"]
		return p.Generation == peers["prefill"].Generation+1 && p.State == "ready"
	})
	// The store says ready before the router's snapshot has it: the pairs
	// come from that snapshot.
	waitFor(t, "a routable pair", 30*time.Second, cp.routable)
	before := metrics(t, s.decode.URL())
	a := post(t, cp.URL+"/v1/chat/completions", chatBody("hello heal", 4, false), 3*time.Minute)
	after := metrics(t, s.decode.URL())
	failed := sumSeries(after, nixlFailedTransfers) - sumSeries(before, nixlFailedTransfers)
	t.Logf("request on the broken pair: %d %s; decode's failed NIXL transfers +%v", a.Status, a.Body, failed)
	if a.Status == 200 {
		t.Fatal("the pair did not break: vLLM's decode loaded KV from a prefill restarted under the same engine_id")
	}
	if failed <= 0 {
		t.Errorf("the decode counted no failed NIXL transfer (%v)", failed)
	}
	waitFor(t, "the decode healed at the next generation", 4*time.Minute, func() bool {
		p := cp.peers(t)["decode"]
		return p.Generation == decodeGen+1 && p.State == "ready"
	})
	if n := sv.count("decode"); n != 1 {
		t.Errorf("the heal action restarted the decode %d times, want once", n)
	}
	waitFor(t, "a routable pair", 30*time.Second, cp.routable)
	ok := post(t, cp.URL+"/v1/chat/completions", chatBody("hello after the heal", 4, false), 2*time.Minute)
	wantOK(t, "chat after the heal", ok, "application/json")
	var ev struct {
		Events []struct{ Kind, Message, PeerName string } `json:"events"`
	}
	getJSON(t, cp.URL+"/api/v1/events?limit=200", &ev)
	var kinds []string
	for _, e := range ev.Events {
		kinds = append(kinds, e.Kind)
	}
	for _, k := range []string{"stale", "reregistered"} {
		if !slices.Contains(kinds, k) {
			t.Errorf("no %s event: %v", k, kinds)
		}
	}
	if slices.Contains(kinds, "failed") {
		t.Errorf("a peer failed: %v", kinds)
	}
	_ = pdproto.Done
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	a, err := tryGet(ctx, url)
	return a.Body, err
}
