package devfleet_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/devfleet"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// fleet is the end-to-end set-up of the self-healing test: control-plane
// replicas and a devfleet.Fleet whose agents spread over them, talking
// real HTTP over 127.0.0.1.
type fleet struct {
	replicas []*controlPlane
	*devfleet.Fleet
	failedAt chan time.Time // one entry per failed transfer reported by a sim
}

type fleetConfig struct {
	replicas, prefills, decodes int
	engine                      registry.Engine
	transfer                    string
	databaseURL                 string // empty: one replica on the embedded store
}

// fleetHealHold is the fleets' heal hold: a decode whose pair failed keeps
// serving the other prefills this long, unless they fail too, before it
// drains (registry/heal.go).
const fleetHealHold = time.Second

func startFleet(t *testing.T, fc fleetConfig) *fleet {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	f := &fleet{failedAt: make(chan time.Time, 1000)}
	var urls []string
	for i := 0; i < fc.replicas; i++ {
		cp := startControlPlane(t, cpConfig{databaseURL: fc.databaseURL, healHold: fleetHealHold}, log.With().Int("replica", i).Logger())
		f.replicas = append(f.replicas, cp)
		urls = append(urls, cp.BaseURL)
	}
	cfg := simtest.Config("", "", fc.engine)
	cfg.Transfer = fc.transfer
	if fc.transfer == sim.TransferNIXL {
		cfg = simtest.UseNIXL(t, cfg)
	}
	// With a control plane the transfer secrets come from it.
	cfg.SharedTransferSecret = nil
	cfg.OnTransferError = func(string, string, error) { f.failedAt <- time.Now() }
	fl, err := devfleet.Start(context.Background(), devfleet.Config{
		ControlPlanes: urls, JoinToken: joinToken, Prefills: fc.prefills, Decodes: fc.decodes, Sim: cfg,
	}, log)
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(fl.Close)
	f.Fleet = fl
	f.waitAll(t, "every pair routable", func(s *replica.Snapshot) bool {
		r := s.Routes(sim.DefaultModel)
		if r == nil || len(r.Prefills) != fc.prefills {
			return false
		}
		for _, p := range r.Prefills {
			if len(r.DecodesFor(p.ID)) != fc.decodes {
				return false
			}
		}
		return true
	})
	return f
}

// waitAll waits until cond holds on every replica's routing snapshot and
// returns, per replica, when it first held.
func (f *fleet) waitAll(t *testing.T, what string, cond func(*replica.Snapshot) bool) []time.Time {
	t.Helper()
	at := make([]time.Time, len(f.replicas))
	deadline := time.Now().Add(15 * time.Second)
	for {
		done := true
		for i, cp := range f.replicas {
			if at[i].IsZero() && cond(cp.mirror.Snapshot()) {
				at[i] = time.Now()
			}
			done = done && !at[i].IsZero()
		}
		if done {
			return at
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// watchAll follows every snapshot each replica publishes, from now on, and
// records when one first satisfied cond; wait returns those times, failing
// the test if a replica never got there. Unlike polling, it does not miss a
// state that lasts only between two polls.
func (f *fleet) watchAll(t *testing.T, what string, cond func(*replica.Snapshot) bool) (wait func() []time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	seen := make([]chan time.Time, len(f.replicas))
	for i, cp := range f.replicas {
		seen[i] = make(chan time.Time, 1)
		ch := cp.mirror.Watch(ctx)
		go func() {
			for s := cp.mirror.Snapshot(); ; {
				if cond(s) {
					seen[i] <- time.Now()
					return
				}
				select {
				case <-ctx.Done():
					return
				case s = <-ch:
				}
			}
		}()
	}
	return func() []time.Time {
		t.Helper()
		at := make([]time.Time, len(seen))
		deadline := time.After(15 * time.Second)
		for i := range seen {
			select {
			case at[i] = <-seen[i]:
			case <-deadline:
				t.Fatalf("replica %d never showed %s", i, what)
			}
		}
		return at
	}
}

// waitServed waits until the traffic has served n more streams.
func waitServed(t *testing.T, tr *traffic, n int64, what string) {
	t.Helper()
	want := tr.ok.Load() + n
	deadline := time.Now().Add(15 * time.Second)
	for tr.ok.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %d streams served, want %d (%d failed)", what, tr.ok.Load(), want, tr.failed.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fleet) setFault(t *testing.T, engine string, fault sim.Fault) {
	t.Helper()
	body := fmt.Sprintf(`{"fault": %q}`, fault)
	resp, err := http.Post(f.Engine(engine).Sim().URL()+"/_sim/fault", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("set fault %s on %s: %d", fault, engine, resp.StatusCode)
	}
}

// traffic streams chat completions through the OpenAI SDK from several
// goroutines, round-robin over the replicas, until stop closes.
type traffic struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	wg         sync.WaitGroup
}

func startTraffic(t *testing.T, f *fleet, workers int, stop <-chan struct{}) *traffic {
	tr := &traffic{}
	for w := 0; w < workers; w++ {
		client := openai.NewClient(option.WithBaseURL(f.replicas[w%len(f.replicas)].BaseURL+"/v1/"),
			option.WithAPIKey("unused"), option.WithMaxRetries(0))
		tr.wg.Add(1)
		go func(w int) {
			defer tr.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
					Model:     sim.DefaultModel,
					Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("worker %d request %d: tell me about KV caches", w, i))},
					MaxTokens: openai.Int(8),
				})
				var text strings.Builder
				for stream.Next() {
					if c := stream.Current(); len(c.Choices) > 0 {
						text.WriteString(c.Choices[0].Delta.Content)
					}
				}
				err := stream.Err()
				cancel()
				if err == nil && text.Len() == 0 {
					err = fmt.Errorf("empty completion")
				}
				if err != nil {
					tr.failed.Add(1)
					tr.mu.Lock()
					tr.errs = append(tr.errs, err.Error())
					tr.mu.Unlock()
					continue
				}
				tr.ok.Add(1)
			}
		}(w)
	}
	return tr
}

// TestSelfHealing is the loop the product exists for: while clients stream
// completions, one decode starts failing with SGLang's "Missing NIXL
// destination KV memory kind". Its first failing pair is quarantined and
// its heal plan holds; when every prefill's pair has failed, or the hold
// (fleetHealHold) is over, it goes stale on every replica, then comes back
// re-registered with a fresh NIXL agent, and no client request may fail.
//
// The test logs how long each step took (the targets are < 100 ms to stale
// once the hold's end is seen, at the decode's next heartbeat, and < 2 s
// to routable again, both after the hold;
// run it with -v and without -race for the figures). It asserts only
// bounds ten times looser, because a timing on a loaded 2-core machine
// under the race detector is not a measurement.
func TestSelfHealing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		engine   registry.Engine
		transfer string
	}{
		{"sglang-tcp", registry.EngineSGLang, sim.TransferTCP},
		{"vllm-tcp", registry.EngineVLLM, sim.TransferTCP},
		{"sglang-nixl", registry.EngineSGLang, sim.TransferNIXL},
	} {
		t.Run(tc.name, func(t *testing.T) { // one fleet at a time: the figures are logged
			dbURL, _ := registrytest.NewSchema(t)
			f := startFleet(t, fleetConfig{replicas: 2, prefills: 2, decodes: 2, engine: tc.engine, transfer: tc.transfer, databaseURL: dbURL})
			victim := "decode-0"
			before := peerByName(f.replicas[0].mirror.Snapshot(), victim)

			stop := make(chan struct{})
			tr := startTraffic(t, f, 4, stop)
			waitServed(t, tr, 8, "steady traffic before the fault")
			// Only the victim's stale state counts as the mark seen: a
			// replica that shows it already re-registered has not shown
			// the mark, however fast the heal was.
			waitStale := f.watchAll(t, victim+" stale", func(s *replica.Snapshot) bool {
				p := peerByName(s, victim)
				return p != nil && p.State == registry.StateStale && p.Generation == before.Generation
			})
			f.setFault(t, victim, sim.FaultMissingMemKind)

			var failed time.Time
			select {
			case failed = <-f.failedAt:
			case <-time.After(10 * time.Second):
				t.Fatal("no transfer failed after the fault was injected")
			}
			staleAt := waitStale()
			readyAt := f.waitAll(t, victim+" re-registered and routable", func(s *replica.Snapshot) bool {
				p := peerByName(s, victim)
				if p == nil || p.Generation != before.Generation+1 || p.State != registry.StateReady {
					return false
				}
				r := s.Routes(sim.DefaultModel)
				for _, pf := range r.Prefills {
					for _, d := range r.DecodesFor(pf.ID) {
						if d.ID == p.ID {
							return true
						}
					}
				}
				return false
			})
			// Traffic over the healed pair: the re-registered decode takes
			// transfers again.
			healed := f.Engine(victim).Sim().Stats().Transfers
			deadline := time.Now().Add(15 * time.Second)
			for f.Engine(victim).Sim().Stats().Transfers < healed+2 {
				if time.Now().After(deadline) {
					t.Fatalf("the re-registered %s took no traffic", victim)
				}
				time.Sleep(time.Millisecond)
			}
			close(stop)
			tr.wg.Wait()

			after := peerByName(f.replicas[1].mirror.Snapshot(), victim)
			if after.Ranks[0].AgentName == before.Ranks[0].AgentName {
				t.Errorf("re-registered under the same NIXL agent name %s", after.Ranks[0].AgentName)
			}
			// The store made the decode stale at once (no prefill named)
			// or when its plan's hold ended: the replicas' figures count
			// from then.
			marked := firstEventAt(t, f.replicas[1].store, before.ID, registry.EventStale, registry.EventHealDraining)
			t.Logf("the store made %s stale %v after the failed transfer (the hold is %s, its end seen at a heartbeat)",
				victim, marked.Sub(failed).Round(time.Millisecond), fleetHealHold)
			for i := range f.replicas {
				t.Logf("replica %d: stale %v after the store's mark, routable again %v after it",
					i, staleAt[i].Sub(marked).Round(100*time.Microsecond), readyAt[i].Sub(marked).Round(time.Millisecond))
				if d := staleAt[i].Sub(marked); d > time.Second {
					t.Errorf("replica %d saw the stale mark %v after the store made it (target < 100ms)", i, d)
				}
				if d := readyAt[i].Sub(marked); d > 20*time.Second {
					t.Errorf("replica %d had it routable again %v after the stale mark (target < 2s)", i, d)
				}
			}
			if n := tr.failed.Load(); n > 0 {
				t.Errorf("%d of %d client requests failed: %v", n, n+tr.ok.Load(), tr.errs[:min(5, len(tr.errs))])
			}
			// The heal restarted the victim once; the other engines never.
			for _, e := range f.Engines() {
				want := 0
				if e.Sim().Config().Name == victim {
					want = 1
				}
				if n := len(e.Retired()); n != want {
					t.Errorf("%s restarted %d times, want %d", e.Sim().Config().Name, n, want)
				}
			}
			var verified, mismatched int64
			for _, e := range f.Engines() {
				name := e.Sim().Config().Name
				for _, st := range append(e.Retired(), e.Sim().Stats()) {
					mismatched += st.VerifyFailures
					if strings.HasPrefix(name, "decode") {
						verified += st.Transfers - st.VerifyFailures
					}
				}
			}
			t.Logf("%d streams served, %d KV transfers verified on the decodes", tr.ok.Load(), verified)
			if mismatched > 0 || verified < tr.ok.Load() || tr.ok.Load() == 0 {
				t.Errorf("KV verification: %d mismatches, %d verified for %d streams", mismatched, verified, tr.ok.Load())
			}
			// The event log tells the story, on either replica.
			kinds := eventKinds(t, f.replicas[1].store, after.ID)
			// SGLang's failure names the prefill: the plan quarantines the
			// pair and holds, then drains. vLLM's is the decode's own read
			// failure, reported without a prefill: stale at once.
			want := []registry.EventKind{registry.EventQuarantined, registry.EventHealStarted, registry.EventHealDraining,
				registry.EventHealActing, registry.EventReregistered, registry.EventHealed, registry.EventQuarantineLifted}
			if tc.engine == registry.EngineVLLM {
				want = []registry.EventKind{registry.EventStale, registry.EventHealStarted, registry.EventHealActing,
					registry.EventReregistered, registry.EventHealed}
			}
			for _, want := range want {
				if !slices.Contains(kinds, want) {
					t.Errorf("event log of %s lacks %s: %v", victim, want, kinds)
				}
			}
		})
	}
}

// TestQuarantineAfterRepeatFailure: a pair that fails the same way right
// after its decode re-registered is quarantined instead of looping through
// stale marks, and the reason names the geometry.
func TestQuarantineAfterRepeatFailure(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{replicas: 1, prefills: 1, decodes: 1, engine: registry.EngineSGLang, transfer: sim.TransferTCP})
	cp := f.replicas[0]
	client := openai.NewClient(option.WithBaseURL(cp.BaseURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ask := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: sim.DefaultModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			MaxTokens: openai.Int(2),
		})
		return err
	}
	if err := ask(); err != nil {
		t.Fatalf("healthy fleet: %v", err)
	}
	d0 := peerByName(cp.mirror.Snapshot(), "decode-0")
	// First failure: the decode is marked stale and re-registers.
	f.setFault(t, "decode-0", sim.FaultMissingMemKind)
	_ = ask() // fails: the only decode is broken
	f.waitAll(t, "decode-0 re-registered", func(s *replica.Snapshot) bool {
		p := peerByName(s, "decode-0")
		return p != nil && p.Generation == d0.Generation+1 && p.State == registry.StateReady
	})
	// The same failure right after the fresh registration: deterministic.
	f.setFault(t, "decode-0", sim.FaultMissingMemKind)
	_ = ask()
	f.waitAll(t, "pair quarantined", quarantined("prefill-0", "decode-0"))
	kinds := eventKinds(t, cp.store, d0.ID)
	if !slices.Contains(kinds, registry.EventQuarantined) {
		t.Fatalf("no quarantine event: %v", kinds)
	}
	if n := registrytest.CountKinds(kinds, registry.EventStale); n != 1 {
		t.Errorf("decode-0 was marked stale %d times; the repeat must quarantine, not loop", n)
	}
	if p := peerByName(cp.mirror.Snapshot(), "decode-0"); p.State != registry.StateReady {
		t.Errorf("decode-0 is %s after the quarantine; only the pair leaves routing", p.State)
	}
	resp, err := http.Get(cp.BaseURL + "/api/v1/pairs")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(buf.String(), `"quarantined":true`) {
		t.Errorf("pairs API does not show the quarantine: %s", buf.String())
	}
}

// TestBrokenPairFailsNoClient is the reliability core's first scenario with
// real agents and the TCP transfer (what pdplane dev runs): two prefills,
// one decode, the decode's registration broken on one prefill only. Every
// request succeeds: the one that meets the broken pair is retried on the
// other prefill; the broken pair's failures do not touch the healthy
// pair's transfers (the sim breaks only the pair it was told to), and the
// registry quarantines the pair while the decode keeps serving.
func TestBrokenPairFailsNoClient(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetConfig{replicas: 1, prefills: 2, decodes: 1, engine: registry.EngineSGLang, transfer: sim.TransferTCP})
	cp := f.replicas[0]
	p0 := f.Engine("prefill-0").Sim()
	body := fmt.Sprintf(`{"fault": %q, "bootstrap_port": %d}`, sim.FaultMissingMemKind, p0.BootstrapPort())
	resp, err := http.Post(f.Engine("decode-0").Sim().URL()+"/_sim/fault", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("set the pair fault: %d", resp.StatusCode)
	}
	client := openai.NewClient(option.WithBaseURL(cp.BaseURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: sim.DefaultModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("request %d", i))},
			MaxTokens: openai.Int(2),
		})
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := p0.Stats().MissingMemKind; n == 0 {
		t.Fatal("no request met the broken pair")
	}
	if n := f.Engine("prefill-1").Sim().Stats().MissingMemKind; n != 0 {
		t.Fatalf("the healthy prefill failed %d transfers", n)
	}
	f.waitAll(t, "the broken pair quarantined", quarantined("prefill-0", "decode-0"))
}

// quarantined holds when the pair of the peers so named is quarantined.
func quarantined(prefill, decode string) func(*replica.Snapshot) bool {
	return func(s *replica.Snapshot) bool {
		p, d := peerByName(s, prefill), peerByName(s, decode)
		if p == nil || d == nil {
			return false
		}
		_, ok := s.Quarantined(p.ID, d.ID)
		return ok
	}
}

func eventKinds(t *testing.T, s registry.Store, peerID string) []registry.EventKind {
	t.Helper()
	evs, err := s.Events(context.Background(), registry.EventQuery{PeerID: peerID, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].ID < evs[j].ID })
	out := make([]registry.EventKind, len(evs))
	for i := range evs {
		out[i] = evs[i].Kind
	}
	return out
}

// firstEventAt is when the first of the peer's events of one of kinds
// happened.
func firstEventAt(t *testing.T, s registry.Store, peerID string, kinds ...registry.EventKind) time.Time {
	t.Helper()
	evs, err := s.Events(context.Background(), registry.EventQuery{PeerID: peerID, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].ID < evs[j].ID })
	for _, e := range evs {
		if slices.Contains(kinds, e.Kind) {
			return e.At
		}
	}
	t.Fatalf("no %v event of %s", kinds, peerID)
	return time.Time{}
}
