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

func TestVLLM(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineVLLM, nil)
	long := strings.Repeat("pull the blocks from the prefill ", 6)
	pr, dr := pdOK(t, p, d, "/v1/chat/completions", chatBody(long, 5, false))
	pa, da := decodeAnswer(t, pr), decodeAnswer(t, dr)
	kv := pa.KVTransferParams
	if kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false || kv["remote_engine_id"] != p.AgentName() ||
		kv["remote_host"] != "127.0.0.1" || int(kv["remote_port"].(float64)) != p.BootstrapPort() || kv["tp_size"] != 1.0 {
		t.Fatalf("prefill kv_transfer_params %v", kv)
	}
	// One list of blocks per KV cache group, as vLLM 0.32 answers.
	groups, _ := kv["remote_block_ids"].([]any)
	if len(groups) != 1 {
		t.Fatalf("remote_block_ids %v: want one KV cache group", kv["remote_block_ids"])
	}
	if blocks, _ := groups[0].([]any); len(blocks) != (pa.Usage.PromptTokens+3)/4 {
		t.Fatalf("%d blocks for %d prompt tokens", len(blocks), pa.Usage.PromptTokens)
	}
	if pa.Usage.CompletionTokens != 1 || da.Usage.CompletionTokens != 5 || len(strings.Fields(da.Choices[0].Message.Content)) != 5 {
		t.Fatalf("prefill %s\ndecode %s", pr.Body, dr.Body)
	}
	// The decode's READ told the prefill to free its blocks.
	waitFor(t, "held blocks freed", func() bool { return p.Load().KVUsage == 0 && d.Load().KVUsage == 0 })

	// Streaming completions.
	body := map[string]any{"model": "sim-model", "prompt": "stream it", "max_tokens": 4, "stream": true}
	_, dr = pdOK(t, p, d, "/v1/completions", body)
	evs, done := simtest.Events(dr.Body)
	if len(evs) != 4 || !done {
		t.Fatalf("stream %s", dr.Body)
	}
	if ds := d.Stats(); ds.Transfers != 2 || ds.VerifyFailures != 0 || len(ds.Remotes) != 1 || ds.Remotes[0].Agent != p.AgentName() {
		t.Fatalf("decode stats %+v", ds)
	}

	// Without kv_transfer_params a vLLM engine just serves.
	r, err := simtest.NewClient().Post(context.Background(), d.URL(), "/v1/completions", map[string]any{"prompt": "plain", "max_tokens": 2}, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("plain: %v %d %s", err, r.Status, r.Body)
	}
	// vLLM serves no /generate.
	r, _ = simtest.NewClient().Post(context.Background(), d.URL(), "/generate", map[string]any{"text": "x"}, nil)
	if r.Status != http.StatusNotFound && r.Status != http.StatusMethodNotAllowed {
		t.Fatalf("/generate on vLLM: %d", r.Status)
	}
	// A prefill refuses to stream the prefill leg.
	pb := simtest.VLLMPrefillBody(chatBody("x", 3, false))
	pb["stream"] = true
	if r, _ := simtest.NewClient().Post(context.Background(), p.URL(), "/v1/chat/completions", pb, nil); r.Status != http.StatusBadRequest {
		t.Fatalf("streamed prefill leg: %d %s", r.Status, r.Body)
	}
}

func TestVLLMCorruptAndPrefillReregister(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineVLLM, nil)
	if err := p.SetFault(sim.FaultCorruptKV); err != nil {
		t.Fatal(err)
	}
	_, dr, err := simtest.NewClient().VLLM(context.Background(), p, d, "/v1/chat/completions", chatBody("bad bytes", 2, false))
	if err != nil || dr.Status != http.StatusInternalServerError || d.Stats().VerifyFailures != 1 {
		t.Fatalf("%v decode %d %s", err, dr.Status, dr.Body)
	}
	p.SetFault(sim.FaultNone)
	old := p.AgentName()
	pdOK(t, p, d, "/v1/chat/completions", chatBody("good bytes", 2, false))
	// The prefill re-registers: its engine id changes and the decode loads
	// the new agent.
	if err := p.Reregister(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	pr, _ := pdOK(t, p, d, "/v1/chat/completions", chatBody("good bytes", 2, false))
	if a := decodeAnswer(t, pr); a.KVTransferParams["remote_engine_id"] == old {
		t.Fatalf("engine id unchanged after re-registration")
	}
	if rs := d.Stats().Remotes; len(rs) != 1 || rs[0].Agent != p.AgentName() || rs[0].Generation != 2 {
		t.Fatalf("decode remotes %+v", rs)
	}
	waitFor(t, "pages freed", func() bool { return p.Load().KVUsage == 0 && d.Load().KVUsage == 0 })
}

func TestVLLMHeldBlocksTimeOut(t *testing.T) {
	t.Parallel()
	p := simtest.Start(t, func() sim.Config {
		c := simtest.Config("p0", registry.RolePrefill, registry.EngineVLLM)
		c.RoomTimeout = 100 * time.Millisecond
		return c
	}())
	r, err := simtest.NewClient().Post(context.Background(), p.URL(), "/v1/completions", simtest.VLLMPrefillBody(map[string]any{"prompt": "nobody reads me"}), nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("%v %d %s", err, r.Status, r.Body)
	}
	if p.Load().KVUsage == 0 {
		t.Fatal("no blocks held")
	}
	waitFor(t, "held blocks expired", func() bool { return p.Load().KVUsage == 0 })
	if p.Stats().RoomTimeouts != 1 {
		t.Fatalf("stats %+v", p.Stats())
	}
}

func TestVLLMMissingMemKind(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var reported []string
	var lastErr error
	p, d := simtest.Pair(t, registry.EngineVLLM, func(c *sim.Config) {
		c.OnTransferError = func(peerID, _ string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, peerID)
			lastErr = err
		}
	})
	d.SetPeerID("peer-d0")
	missingMemKind(t, p, d, func(ctx context.Context, c *simtest.Client) (simtest.Response, simtest.Response, error) {
		return c.VLLM(ctx, p, d, "/v1/chat/completions", chatBody("read me", 3, false))
	})
	mu.Lock()
	defer mu.Unlock()
	var mk *transfer.MissingMemKindError
	if len(reported) != 3 || reported[0] != "peer-d0" || !errors.As(lastErr, &mk) {
		t.Fatalf("reports %v, %v", reported, lastErr)
	}
}

func TestVLLMRequestParams(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineVLLM, nil)
	pr, _ := pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "abc def", "max_tokens": 2})
	var a struct {
		KV map[string]any `json:"kv_transfer_params"`
	}
	json.Unmarshal(pr.Body, &a)
	c := simtest.NewClient()
	for name, edit := range map[string]func(kv map[string]any){
		"no engine":  func(kv map[string]any) { kv["remote_engine_id"] = nil },
		"no port":    func(kv map[string]any) { kv["remote_port"] = nil },
		"few blocks": func(kv map[string]any) { kv["remote_block_ids"] = [][]int{{}} },
	} {
		kv := map[string]any{}
		for k, v := range a.KV {
			kv[k] = v
		}
		edit(kv)
		r, err := c.Post(context.Background(), d.URL(), "/v1/completions", map[string]any{"prompt": "abc def", "kv_transfer_params": kv}, nil)
		if err != nil || r.Status != http.StatusBadRequest {
			t.Fatalf("%s: %v %d %s", name, err, r.Status, r.Body)
		}
	}
}
