package sim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/kvevents"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// vllmTokens is vLLM's /tokenize of prompt on s.
func vllmTokens(t *testing.T, s *sim.Sim, prompt string) []int32 {
	t.Helper()
	var tok struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := json.Unmarshal(postOK(t, s, "/tokenize", map[string]any{"model": "sim-model", "prompt": prompt}).Body, &tok); err != nil {
		t.Fatal(err)
	}
	return tok.Tokens
}

// nextMessage is the next message the stream hands on.
func nextMessage(t *testing.T, got <-chan kvevents.Message, errs <-chan error) kvevents.Message {
	t.Helper()
	select {
	case m := <-got:
		return m
	case err := <-errs:
		t.Fatalf("the KV events stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no KV events batch within 10 s")
	}
	return kvevents.Message{}
}

// TestKVEventsPublisher: a prefill publishes its prefix cache on vLLM's
// wire, read by kvevents.Stream as it reads a real vLLM 0.32
// (vllm/distributed/kv_events.py ZmqEventPublisher; kvevents' fixture was
// written by vLLM's encoder). A prompt of three blocks and a token is
// stored as three blocks whose token IDs are the prompt's (/tokenize),
// chained by their hashes; a subscriber from sequence 0 is replayed it; a
// prompt that overflows the cache evicts the least recently used block
// (BlockRemoved); batches are numbered one after the other.
func TestKVEventsPublisher(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineVLLM, registry.EngineSGLang} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			const topic = "kv@p0"
			cfg := simtest.Config("p0", registry.RolePrefill, engine)
			cfg.Pages = 8 // eight blocks of 4 tokens in the cache
			cfg.KVEventsAddr, cfg.KVEventsReplayAddr, cfg.KVEventsTopic = "127.0.0.1:0", "127.0.0.1:0", topic
			p := simtest.Start(t, cfg)
			var d *sim.Sim
			if engine == registry.EngineSGLang {
				d = simtest.Start(t, simtest.Config("d0", registry.RoleDecode, engine))
			}
			prefill := func(prompt string) {
				t.Helper()
				body := map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 1}
				if d == nil {
					postOK(t, p, "/v1/completions", body)
					return
				}
				pr, dr, err := simtest.NewClient().SGLang(context.Background(), p, d, "/v1/completions", body, simtest.Room())
				if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
					t.Fatalf("SGLang PD completion: %v, prefill %d %s, decode %d %s", err, pr.Status, pr.Body, dr.Status, dr.Body)
				}
			}
			ep, rep := p.KVEventsEndpoints()
			if !strings.HasPrefix(ep, "tcp://127.0.0.1:") || !strings.HasPrefix(rep, "tcp://127.0.0.1:") || ep == rep {
				t.Fatalf("endpoints %q and %q", ep, rep)
			}
			kcfg := kvevents.Config{Endpoint: strings.TrimPrefix(ep, "tcp://"), ReplayEndpoint: strings.TrimPrefix(rep, "tcp://"), Topic: topic}

			a := words(0, 12) // BOS and 12 words: three blocks and a token
			var tokens []int32
			if engine == registry.EngineVLLM {
				tokens = vllmTokens(t, p, a)
			} else {
				var tok struct {
					Tokens []int32 `json:"tokens"`
				}
				if err := json.Unmarshal(postOK(t, p, "/v1/tokenize", map[string]any{"prompt": a}).Body, &tok); err != nil {
					t.Fatal(err)
				}
				tokens = tok.Tokens
			}
			if len(tokens) != 13 {
				t.Fatalf("the prompt is %d tokens, want 13", len(tokens))
			}
			prefill(a) // before anyone subscribes: only a replay has it

			ctx, cancel := context.WithCancel(context.Background())
			got, errs := make(chan kvevents.Message, 16), make(chan error, 1)
			go func() {
				_, err := kvevents.Stream(ctx, kcfg, 0, func(m kvevents.Message) { got <- m })
				errs <- err
			}()
			t.Cleanup(func() {
				cancel()
				if err := <-errs; err != nil {
					t.Errorf("the KV events stream: %v", err)
				}
			})
			m := nextMessage(t, got, errs)
			if m.Seq != 0 || m.Missed != 0 || len(m.Batch.Events) != 1 {
				t.Fatalf("the replayed batch: seq %d, %d missed, %+v", m.Seq, m.Missed, m.Batch)
			}
			stored := m.Batch.Events[0]
			if stored.Kind != kvevents.BlockStored || len(stored.BlockHashes) != 3 || stored.ParentHash != "" ||
				stored.BlockSize != 4 || stored.Medium != "GPU" || !slices.Equal(stored.TokenIDs, tokens[:12]) {
				t.Fatalf("the first prompt's event: %+v, want 3 blocks of 4 holding %v", stored, tokens[:12])
			}
			for _, h := range stored.BlockHashes {
				if len(h) != 8 {
					t.Fatalf("a block hash of %d bytes, want vLLM's 8-byte integers", len(h))
				}
			}

			simtest.WaitFor(t, "the live subscription", func() bool { return sim.KVEventsSubscribed(p, topic) })
			prefill(words(100, 24)) // six more blocks: one of the first prompt's goes
			m = nextMessage(t, got, errs)
			if m.Seq != 1 || m.Missed != 0 || len(m.Batch.Events) != 2 {
				t.Fatalf("the second batch: seq %d, %d missed, %+v", m.Seq, m.Missed, m.Batch)
			}
			second, removed := m.Batch.Events[0], m.Batch.Events[1]
			if second.Kind != kvevents.BlockStored || len(second.BlockHashes) != 6 || second.ParentHash != "" {
				t.Errorf("the second prompt's event: %+v", second)
			}
			if removed.Kind != kvevents.BlockRemoved || !slices.Equal(removed.BlockHashes, stored.BlockHashes[:1]) {
				t.Errorf("the eviction: %+v, want the first prompt's first block %x", removed, stored.BlockHashes[0])
			}

			// The first prompt again: its first block is stored anew, the
			// two others are still held; the cache evicts the least
			// recently used of the second prompt's.
			prefill(a)
			m = nextMessage(t, got, errs)
			if m.Seq != 2 || len(m.Batch.Events) != 2 || m.Batch.Events[0].Kind != kvevents.BlockStored ||
				!slices.Equal(m.Batch.Events[0].BlockHashes, stored.BlockHashes[:1]) || m.Batch.Events[1].Kind != kvevents.BlockRemoved {
				t.Errorf("the first prompt again: seq %d %+v", m.Seq, m.Batch)
			}
		})
	}
}
