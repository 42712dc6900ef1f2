package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
	"github.com/pdplane/pdplane/transfer"
)

func TestSGLangNonStreaming(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	long := strings.Repeat("the prompt spans several pages of KV ", 8)

	_, dr := pdOK(t, p, d, "/v1/chat/completions", chatBody(long, 7, false))
	a := decodeAnswer(t, dr)
	if n := len(strings.Fields(a.Choices[0].Message.Content)); n != 7 {
		t.Fatalf("%d words, want 7: %q", n, a.Choices[0].Message.Content)
	}
	if a.Usage == nil || a.Usage.CompletionTokens != 7 || a.Usage.PromptTokens < 20 || *a.Choices[0].FinishReason != "length" {
		t.Fatalf("usage %+v finish %v", a.Usage, a.Choices[0].FinishReason)
	}
	// Deterministic: the same prompt gives the same text.
	_, dr2 := pdOK(t, p, d, "/v1/chat/completions", chatBody(long, 7, false))
	if b := decodeAnswer(t, dr2); b.Choices[0].Message.Content != a.Choices[0].Message.Content {
		t.Fatalf("answers differ: %q vs %q", a.Choices[0].Message.Content, b.Choices[0].Message.Content)
	}

	// Completions, with the default length: finish_reason "stop".
	_, dr = pdOK(t, p, d, "/v1/completions", map[string]any{"model": "sim-model", "prompt": "once upon a time"})
	a = decodeAnswer(t, dr)
	if n := len(strings.Fields(a.Choices[0].Text)); n != sim.DefaultMaxTokens || *a.Choices[0].FinishReason != "stop" {
		t.Fatalf("completion %q finish %v", a.Choices[0].Text, *a.Choices[0].FinishReason)
	}

	// SGLang native, from token ids.
	_, dr = pdOK(t, p, d, "/generate", map[string]any{"input_ids": []int{5, 6, 7, 8, 9, 10}, "sampling_params": map[string]any{"max_new_tokens": 3}})
	var g struct {
		Text      string `json:"text"`
		OutputIDs []int  `json:"output_ids"`
		MetaInfo  struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			FinishReason     struct {
				Type string `json:"type"`
			} `json:"finish_reason"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(dr.Body, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.OutputIDs) != 3 || g.MetaInfo.PromptTokens != 6 || g.MetaInfo.CompletionTokens != 3 || g.MetaInfo.FinishReason.Type != "length" {
		t.Fatalf("generate answer %s", dr.Body)
	}

	ps, ds := p.Stats(), d.Stats()
	if ps.Transfers != 4 || ds.Transfers != 4 || ds.VerifyFailures != 0 || ps.BytesMoved == 0 {
		t.Fatalf("prefill %+v\ndecode %+v", ps, ds)
	}
	waitFor(t, "pages freed", func() bool { return p.Load().KVUsage == 0 && d.Load().KVUsage == 0 })
}

func TestSGLangStreaming(t *testing.T) {
	t.Parallel()
	const pause = 15 * time.Millisecond
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = pause })
	body := chatBody("stream me a few tokens", 6, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	body["bootstrap_host"] = "127.0.0.1"
	body["bootstrap_port"] = p.BootstrapPort()
	body["bootstrap_room"] = simtest.Room()

	var wg sync.WaitGroup
	var pr simtest.Response
	var perr error
	wg.Go(func() {
		pr, perr = simtest.NewClient().Post(context.Background(), p.URL(), "/v1/chat/completions", body, nil)
	})
	status, evs, err := stream(context.Background(), d.URL(), "/v1/chat/completions", body, nil)
	wg.Wait()
	if err != nil || perr != nil || status != http.StatusOK || pr.Status != http.StatusOK {
		t.Fatalf("decode %d %v; prefill %d %v %s", status, err, pr.Status, perr, pr.Body)
	}
	if len(evs) != 6+1+1 || string(evs[len(evs)-1].data) != "[DONE]" {
		t.Fatalf("%d events: %v", len(evs), evs)
	}
	var text strings.Builder
	for i, ev := range evs[:6] {
		var c chatAnswer
		if err := json.Unmarshal(ev.data, &c); err != nil {
			t.Fatal(err)
		}
		text.WriteString(c.Choices[0].Delta.Content)
		if (i == 5) != (c.Choices[0].FinishReason != nil) {
			t.Fatalf("event %d finish %v", i, c.Choices[0].FinishReason)
		}
	}
	var u chatAnswer
	if err := json.Unmarshal(evs[6].data, &u); err != nil || u.Usage == nil || u.Usage.CompletionTokens != 6 {
		t.Fatalf("usage event %s", evs[6].data)
	}
	// Flushed one by one, with the decode's pause between tokens.
	if gap := evs[5].at.Sub(evs[0].at); gap < 4*pause {
		t.Fatalf("6 tokens spread over only %s", gap)
	}
	// The stream carries the same text as a non-streamed answer.
	_, dr := pdOK(t, p, d, "/v1/chat/completions", chatBody("stream me a few tokens", 6, false))
	if a := decodeAnswer(t, dr); a.Choices[0].Message.Content != text.String() {
		t.Fatalf("streamed %q, non-streamed %q", text.String(), a.Choices[0].Message.Content)
	}
	// The prefill streamed its one token too.
	if pevs, done := simtest.Events(pr.Body); len(pevs) != 2 || !done {
		t.Fatalf("prefill stream %s", pr.Body)
	}
}

func TestSGLangLogprobsAndBatch(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	pr, dr := pdOK(t, p, d, "/generate", map[string]any{"text": "four score and seven", "return_logprob": true, "sampling_params": map[string]any{"max_new_tokens": 2}})
	type meta struct {
		MetaInfo struct {
			PromptTokens        int     `json:"prompt_tokens"`
			InputTokenLogprobs  [][]any `json:"input_token_logprobs"`
			OutputTokenLogprobs [][]any `json:"output_token_logprobs"`
		} `json:"meta_info"`
	}
	var pm, dm meta
	if err := json.Unmarshal(pr.Body, &pm); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(dr.Body, &dm); err != nil {
		t.Fatal(err)
	}
	if len(pm.MetaInfo.InputTokenLogprobs) != pm.MetaInfo.PromptTokens || pm.MetaInfo.InputTokenLogprobs[0][0] != nil || pm.MetaInfo.InputTokenLogprobs[1][0] == nil {
		t.Fatalf("prefill input logprobs %s", pr.Body)
	}
	if dm.MetaInfo.InputTokenLogprobs == nil || len(dm.MetaInfo.InputTokenLogprobs) != 0 || len(dm.MetaInfo.OutputTokenLogprobs) != 2 {
		t.Fatalf("decode logprobs %s", dr.Body)
	}

	// A batch: bootstrap lists, one room per prompt, an array answer.
	rooms := []uint64{simtest.Room(), simtest.Room(), simtest.Room()}
	body := map[string]any{
		"text":            []string{"alpha", "bravo charlie delta echo foxtrot golf hotel", "india"},
		"sampling_params": map[string]any{"max_new_tokens": 4},
		"bootstrap_host":  []string{"127.0.0.1", "127.0.0.1", "127.0.0.1"},
		"bootstrap_port":  []int{p.BootstrapPort(), p.BootstrapPort(), p.BootstrapPort()},
		"bootstrap_room":  rooms,
	}
	c := simtest.NewClient()
	var wg sync.WaitGroup
	var pb simtest.Response
	wg.Go(func() { pb, _ = c.Post(context.Background(), p.URL(), "/generate", body, nil) })
	db, err := c.Post(context.Background(), d.URL(), "/generate", body, nil)
	wg.Wait()
	if err != nil || db.Status != http.StatusOK || pb.Status != http.StatusOK {
		t.Fatalf("batch: %v prefill %d %s decode %d %s", err, pb.Status, pb.Body, db.Status, db.Body)
	}
	var out []struct {
		Text  string `json:"text"`
		Index int    `json:"index"`
	}
	if err := json.Unmarshal(db.Body, &out); err != nil || len(out) != 3 || out[2].Index != 2 || len(strings.Fields(out[1].Text)) != 4 {
		t.Fatalf("batch answer %s (%v)", db.Body, err)
	}
	// Streamed, the prompts of a batch step together, each event naming
	// its prompt.
	body["bootstrap_room"] = []uint64{simtest.Room(), simtest.Room(), simtest.Room()}
	body["stream"] = true
	wg.Go(func() { pb, _ = c.Post(context.Background(), p.URL(), "/generate", body, nil) })
	db, err = c.Post(context.Background(), d.URL(), "/generate", body, nil)
	wg.Wait()
	evs, done := simtest.Events(db.Body)
	if err != nil || db.Status != http.StatusOK || len(evs) != 12 || !done {
		t.Fatalf("streamed batch: %v %d %s", err, db.Status, db.Body)
	}
	var last struct {
		Index    int `json:"index"`
		MetaInfo struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(evs[11], &last); err != nil || last.Index != 2 || last.MetaInfo.CompletionTokens != 4 {
		t.Fatalf("last event %s", evs[11])
	}
	delete(body, "stream")
	// Scalars for a batch are refused.
	body["bootstrap_room"] = rooms[0]
	if r, _ := c.Post(context.Background(), d.URL(), "/generate", body, nil); r.Status != http.StatusBadRequest {
		t.Fatalf("scalar bootstrap for a batch: %d %s", r.Status, r.Body)
	}
}

func TestSGLangFakeBootstrapHost(t *testing.T) {
	t.Parallel()
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	body := chatBody("health probe", 1, false)
	body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"] = sim.FakeBootstrapHost, 8998, 1
	r, err := simtest.NewClient().Post(context.Background(), d.URL(), "/v1/chat/completions", body, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("%v %d %s", err, r.Status, r.Body)
	}
	// Without a bootstrap triple a PD decode refuses.
	r, _ = simtest.NewClient().Post(context.Background(), d.URL(), "/v1/chat/completions", chatBody("x", 1, false), nil)
	if r.Status != http.StatusBadRequest {
		t.Fatalf("no bootstrap: %d %s", r.Status, r.Body)
	}
}

// TestVerificationCatchesCorruptKV breaks the bytes on purpose: the decode
// must refuse to generate from them.
func TestVerificationCatchesCorruptKV(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	if err := p.SetFault(sim.FaultCorruptKV); err != nil {
		t.Fatal(err)
	}
	pr, dr, err := simtest.NewClient().SGLang(context.Background(), p, d, "/v1/chat/completions", chatBody("corrupt me", 3, false), simtest.Room())
	if err != nil {
		t.Fatal(err)
	}
	if pr.Status != http.StatusOK || dr.Status != http.StatusInternalServerError || !strings.Contains(string(dr.Body), "verification failed") {
		t.Fatalf("prefill %d, decode %d %s", pr.Status, dr.Status, dr.Body)
	}
	if s := d.Stats(); s.VerifyFailures != 1 {
		t.Fatalf("verify failures %d", s.VerifyFailures)
	}
	if err := p.SetFault(sim.FaultNone); err != nil {
		t.Fatal(err)
	}
	pdOK(t, p, d, "/v1/chat/completions", chatBody("corrupt me", 3, false))
	waitFor(t, "decode pages freed", func() bool { return d.Load().KVUsage == 0 })
}

// TestSGLangMissingMemKind reproduces the seed failure and its healing: a
// decode whose registration on the prefill side ends without a memory kind
// makes every transfer to it fail with SGLang's exact message until it
// re-registers under a fresh agent name.
func TestSGLangMissingMemKind(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var reported []string
	var reportedErr error
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) {
		c.RoomTimeout = 300 * time.Millisecond // how long the decode of a failed prefill waits
		c.OnTransferError = func(peerID, agentName string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, peerID+"/"+agentName)
			reportedErr = err
		}
	})
	missingMemKind(t, p, d, func(ctx context.Context, c *simtest.Client) (simtest.Response, simtest.Response, error) {
		return c.SGLang(ctx, p, d, "/v1/chat/completions", chatBody("transfer me", 3, false), simtest.Room())
	})
	mu.Lock()
	defer mu.Unlock()
	var mk *transfer.MissingMemKindError
	// SGLang's bootstrap plane names the decode by its agent only: the
	// report carries the broken agent and no peer ID.
	if len(reported) == 0 || !errors.As(reportedErr, &mk) || reported[0] != "/"+mk.Agent || mk.Agent == d.AgentName() {
		t.Fatalf("OnTransferError got %v, %v; decode agent now %s", reported, reportedErr, d.AgentName())
	}
	// The prefill counted three agents at the decode's endpoint (the first,
	// the broken one the fault started, the re-registered one) and holds
	// only the last.
	rs := p.Stats().Remotes
	if len(rs) != 1 || rs[0].Agent != d.AgentName() || rs[0].Generation != 3 {
		t.Fatalf("prefill remotes %+v, decode agent %s", rs, d.AgentName())
	}
}

// missingMemKind drives the fault scenario through run (one PD request):
// works, fault, fails with the message (twice, and still after the fault is
// cleared without re-registration), Reregister, works.
func missingMemKind(t *testing.T, p, d *sim.Sim, run func(context.Context, *simtest.Client) (simtest.Response, simtest.Response, error)) {
	t.Helper()
	ctx := context.Background()
	c := simtest.NewClient()
	ok := func(when string) {
		t.Helper()
		pr, dr, err := run(ctx, c)
		if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
			t.Fatalf("%s: %v\nprefill %d %s\ndecode %d %s", when, err, pr.Status, pr.Body, dr.Status, dr.Body)
		}
	}
	// failing returns the answer that carries the error: the prefill's for
	// SGLang, the decode's for vLLM.
	failing := func(when string) {
		t.Helper()
		pr, dr, err := run(ctx, c)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if p.Config().Engine == registry.EngineVLLM {
			// vllm entrypoints/openai/engine/serving.py _raise_if_error:
			// a KV load that failed under kv_load_failure_policy=fail is
			// GenerationError("Internal server error"); vLLM never says
			// SGLang's words.
			const want = `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`
			if dr.Status != http.StatusInternalServerError || string(dr.Body) != want {
				t.Fatalf("%s: prefill %d %s\ndecode %d %s", when, pr.Status, pr.Body, dr.Status, dr.Body)
			}
		} else {
			// sglang disaggregation/prefill.py: the prefill aborts with
			// "Prefill transfer failed ... with exception <e>", status 500;
			// not streamed, http_server's HTTPException handler answers
			// {"object":"error","message":...,"type":"500","param":null,"code":500}.
			var e struct {
				Object, Message, Type string
				Code                  int
			}
			if pr.Status != http.StatusInternalServerError || json.Unmarshal(pr.Body, &e) != nil || e.Object != "error" || e.Type != "500" || e.Code != 500 ||
				!strings.HasPrefix(e.Message, "Prefill transfer failed for request rank=0 req.rid='") ||
				!strings.HasSuffix(e.Message, " with exception Missing NIXL destination KV memory kind") {
				t.Fatalf("%s: prefill %d %s\ndecode %d %s", when, pr.Status, pr.Body, dr.Status, dr.Body)
			}
			// Its decode was never told: it waited out its timeout.
			if dr.Status != http.StatusInternalServerError || !strings.Contains(string(dr.Body), "Decode transfer failed for request rank=0 decode_req.req.rid=") {
				t.Fatalf("%s: decode %d %s", when, dr.Status, dr.Body)
			}
		}
		if dr.Status == http.StatusOK {
			t.Fatalf("%s: the decode answered 200 without KV: %s", when, dr.Body)
		}
	}

	ok("before the fault")
	if r, err := c.SetFault(ctx, d, "missing-mem-kind"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("set fault: %v %d %s", err, r.Status, r.Body)
	}
	failing("with the fault")
	failing("again")
	if err := d.SetFault(sim.FaultNone); err != nil {
		t.Fatal(err)
	}
	failing("fault cleared, no re-registration")
	gen := d.Generation()
	if err := d.Reregister(ctx, "missing memory kind"); err != nil {
		t.Fatal(err)
	}
	if d.Generation() != gen+1 {
		t.Fatalf("generation %d after %d", d.Generation(), gen)
	}
	ok("after re-registration")
	ok("and after")
	var stats sim.Stats
	if p.Config().Engine == registry.EngineVLLM {
		stats = d.Stats()
	} else {
		stats = p.Stats()
	}
	if stats.MissingMemKind != 3 {
		t.Fatalf("missing-mem-kind count %d, want 3", stats.MissingMemKind)
	}
	waitFor(t, "pages freed", func() bool { return p.Load().KVUsage == 0 && d.Load().KVUsage == 0 })
}

// TestSGLangCancelAndTimeout: a room whose counterpart never comes times
// out and frees its pages on both sides; a cancelled decode frees its pages.
func TestSGLangCancelAndTimeout(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.RoomTimeout = 300 * time.Millisecond })
	c := simtest.NewClient()
	ctx := context.Background()
	body := chatBody("alone in the room", 2, false)
	body["bootstrap_host"], body["bootstrap_port"] = "127.0.0.1", p.BootstrapPort()

	// Decode alone: times out.
	body["bootstrap_room"] = simtest.Room()
	r, err := c.Post(ctx, d.URL(), "/v1/chat/completions", body, nil)
	if err != nil || r.Status != http.StatusInternalServerError || !strings.Contains(string(r.Body), "timed out") {
		t.Fatalf("decode alone: %v %d %s", err, r.Status, r.Body)
	}
	// Prefill alone: times out.
	body["bootstrap_room"] = simtest.Room()
	r, err = c.Post(ctx, p.URL(), "/v1/chat/completions", body, nil)
	if err != nil || r.Status != http.StatusInternalServerError || !strings.Contains(string(r.Body), "timed out") {
		t.Fatalf("prefill alone: %v %d %s", err, r.Status, r.Body)
	}
	// Decode cancelled by its client.
	body["bootstrap_room"] = simtest.Room()
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = c.Post(cctx, d.URL(), "/v1/chat/completions", body, nil)
	cancel()
	if err == nil {
		t.Fatal("cancelled request answered")
	}
	waitFor(t, "pages freed", func() bool { return p.Load().KVUsage == 0 && d.Load().KVUsage == 0 })
	waitFor(t, "idle", func() bool { l := d.Load(); return l.Running == 0 && l.Queued == 0 })

	// A prefill that fails does not tell its decode (SGLang's NIXL decode
	// only polls for its KV): the decode waits out its timeout, then aborts
	// (sglang disaggregation/decode.py pop_transferred).
	if err := p.SetFault(sim.FaultPrefillError); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, dr, err := c.SGLang(ctx, p, d, "/v1/chat/completions", chatBody("fail fast", 2, false), simtest.Room())
	if err != nil || dr.Status != http.StatusInternalServerError || time.Since(start) < 300*time.Millisecond ||
		!strings.Contains(string(dr.Body), "Decode transfer failed for request") {
		t.Fatalf("decode of a failed prefill: %v %d %s after %s", err, dr.Status, dr.Body, time.Since(start))
	}
}

// TestSGLangRestarts: a prefill that restarts on the same bootstrap port has
// forgotten the decode's KV args: the decode's next send finds its rank
// socket closed, fetches the new rank from the bootstrap server and
// registers again. A decode that restarts comes with a new agent on a new
// rank socket; the prefill keeps the old entry as SGLang does (bounded).
func TestSGLangRestarts(t *testing.T) {
	t.Parallel()
	pc := simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang)
	p1 := simtest.Start(t, pc)
	pc.BootstrapPort = p1.BootstrapPort()
	d1 := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	pdOK(t, p1, d1, "/v1/completions", map[string]any{"prompt": "before", "max_tokens": 2})
	p1.Close()

	p2 := simtest.Start(t, pc)
	pdOK(t, p2, d1, "/v1/completions", map[string]any{"prompt": "after the prefill restarted", "max_tokens": 2})

	d1.Close()
	d2 := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	pdOK(t, p2, d2, "/v1/completions", map[string]any{"prompt": "after the decode restarted", "max_tokens": 2})
	found := false
	for _, r := range p2.Stats().Remotes {
		found = found || r.Agent == d2.AgentName()
	}
	if !found {
		t.Fatalf("prefill remotes %+v lack %s", p2.Stats().Remotes, d2.AgentName())
	}
}
