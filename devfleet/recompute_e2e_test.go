package devfleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestSilentRecomputeIsReported: a vLLM decode that computes the prompts
// its prefill sent (kv_load_failure_policy=recompute after failed loads)
// answers every client, so only its counters tell. Its agent reads them:
// healthy PD traffic reads as no recompute; under the recompute fault the
// decode is reported within a probe interval of the traffic, with the
// figures, naming the pair (the only prefill it exchanged KV with, as the
// router reported its served pairs), and the registry's rule for a failed
// load takes it out of routing until it re-registers; the same failure
// right after that quarantines the pair.
func TestSilentRecomputeIsReported(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{replicas: 1, prefills: 1, decodes: 1, engine: registry.EngineVLLM, transfer: sim.TransferTCP})
	cp := f.replicas[0]
	client := openai.NewClient(option.WithBaseURL(cp.BaseURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	send := func(n int) {
		t.Helper()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			prompt := fmt.Sprintf("request %d: %s", i, strings.Repeat("prompt ", 8))
			_, err := client.Completions.New(ctx, openai.CompletionNewParams{
				Model: sim.DefaultModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}, MaxTokens: openai.Int(2),
			})
			cancel()
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
	}
	dec := f.Engine("decode-0")
	d0 := peerByName(cp.mirror.Snapshot(), "decode-0")
	probes := func() int64 { return dec.Agent().EngineStatus().Probes }

	send(10)
	// Two probes after the traffic, the decode's counters have it all.
	after := probes()
	simtest.WaitFor(t, "two probes of the decode", func() bool { return probes() >= after+2 })
	st := dec.Agent().EngineStatus()
	if st.Recompute.Prompt < 10*10 || st.Recompute.Recomputed != 0 || st.Recomputing {
		t.Fatalf("healthy PD traffic reads as %+v (recomputing %v): want its prompt tokens, none recomputed", st.Recompute, st.Recomputing)
	}

	f.setFault(t, "decode-0", sim.FaultRecompute)
	send(10) // every client is answered: the recompute is silent
	sent := time.Now()
	f.waitAll(t, "decode-0 reported", func(s *replica.Snapshot) bool {
		p := peerByName(s, "decode-0")
		return p != nil && (p.State == registry.StateStale || p.Generation > d0.Generation)
	})
	took := time.Since(sent)
	evs, err := cp.store.Events(context.Background(), registry.EventQuery{PeerID: d0.ID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var reported *registry.Event
	for i := range evs {
		if evs[i].Kind == registry.EventStale && strings.Contains(evs[i].Message, agent.RecomputeReason) {
			reported = &evs[i]
		}
	}
	if reported == nil {
		t.Fatalf("no stale event names the recompute: %+v", evs)
	}
	if !strings.Contains(reported.Error, "computed by the decode instead of loaded by KV transfer") {
		t.Errorf("the report does not give the figures: %q", reported.Error)
	}
	if !strings.Contains(reported.Message, "from prefill prefill-0, the only one it exchanged KV with") {
		t.Errorf("the report does not name the pair: %q", reported.Message)
	}
	// The probe after the traffic sees it (the probes follow the
	// heartbeat interval, 1 s) and the agent reports it at once.
	if limit := registry.DefaultHeartbeatInterval + time.Second; took > limit {
		t.Errorf("reported %s after the traffic, want within %s", took, limit)
	}
	t.Logf("recomputing decode reported %s after the traffic: %s", took.Round(time.Millisecond), reported.Error)
	f.waitAll(t, "decode-0 re-registered", func(s *replica.Snapshot) bool {
		p := peerByName(s, "decode-0")
		return p != nil && p.State == registry.StateReady && p.Generation > d0.Generation
	})

	// The restart did not cure it: the pair is quarantined. The agent
	// first reads the new engine's counters once, so that the traffic
	// shows as their change.
	restarted := probes()
	simtest.WaitFor(t, "a probe of the restarted decode", func() bool { return probes() > restarted })
	f.setFault(t, "decode-0", sim.FaultRecompute)
	send(10)
	f.waitAll(t, "the recomputing pair quarantined", quarantined("prefill-0", "decode-0"))
}
