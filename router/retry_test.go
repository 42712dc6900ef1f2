package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// startSimsOf starts simulated engines of one protocol from simtest.Config,
// one per name and role.
func startSimsOf(t *testing.T, engine registry.Engine, roles map[string]registry.Role) map[string]*sim.Sim {
	t.Helper()
	out := make(map[string]*sim.Sim, len(roles))
	for name, role := range roles {
		out[name] = simtest.Start(t, simtest.Config(name, role, engine))
	}
	return out
}

func setFault(t *testing.T, s *sim.Sim, f sim.Fault) {
	t.Helper()
	if err := s.SetFault(f); err != nil {
		t.Fatal(err)
	}
}

// TestRetryOnAnotherPairBeforeFirstByte: a prefill, then a decode, that
// answers 500 before any byte (the simulator's plain engine error) costs the
// client nothing: the request moves to another pair.
func TestRetryOnAnotherPairBeforeFirstByte(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{
		"p1": registry.RolePrefill, "p2": registry.RolePrefill, "d1": registry.RoleDecode, "d2": registry.RoleDecode,
	})
	setFault(t, s["p1"], sim.FaultPrefillError)
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, DecodePolicy: router.PolicyRoundRobin},
		s["p1"], s["p2"], s["d1"], s["d2"])

	// Round robin reaches p1 within two requests.
	for i := range 2 {
		resp, body := b.post(t, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
		if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || strings.Contains(string(body), "error") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	// Every request p1 failed was retried, and p2 served them all.
	p1 := s["p1"].Stats().Requests
	if p1 == 0 || s["p2"].Stats().Requests != 2 {
		t.Fatalf("p1 saw %d, p2 %d requests", p1, s["p2"].Stats().Requests)
	}
	if got := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "status"}); got != float64(p1) {
		t.Fatalf("retries = %v for %d failed prefills", got, p1)
	}

	// A decode failing before its first byte moves too: d2 serves all.
	setFault(t, s["p1"], sim.FaultNone)
	setFault(t, s["d1"], sim.FaultPrefillError)
	d1Before, d2Before := s["d1"].Stats().Requests, s["d2"].Stats().Transfers
	for range 4 {
		if resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if n := s["d2"].Stats().Transfers - d2Before; n != 4 {
		t.Fatalf("d2 received KV %d times for 4 requests", n)
	}
	d1 := s["d1"].Stats().Requests - d1Before
	if got := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "status"}); d1 == 0 || got != float64(p1+d1) {
		t.Fatalf("retries = %v; p1 failed %d, d1 %d", got, p1, d1)
	}
}

// TestMemKindErrorMarksDecodeStaleAndRetries: the prefill's "Missing NIXL
// destination KV memory kind" moves the request to another decode, cancels
// the failed decode's leg (which SGLang would otherwise hold until its room
// times out), and reports the decode, which the registry marks stale, named
// by the prefill and this replica; the mark reaches the router through the
// snapshot, as it reaches every replica.
func TestMemKindErrorMarksDecodeStaleAndRetries(t *testing.T) {
	t.Parallel()
	b, p, ds := simFleet(t, registry.EngineSGLang, router.Config{Replica: "r7"},
		func(c *sim.Config) { c.RoomTimeout = time.Minute })
	setFault(t, ds[0], sim.FaultMissingMemKind)
	for i := 0; p.Stats().MissingMemKind == 0; i++ {
		if i == 2 {
			t.Fatal("round robin never reached decode-0")
		}
		resp, body := b.post(t, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
		if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	m := b.reg.waitStale(t, "decode-0")
	if !strings.Contains(m.Error, "Missing NIXL destination KV memory kind") || !strings.Contains(m.Message, "prefill-0") ||
		!strings.Contains(m.Message, "(reported by router:r7)") {
		t.Fatalf("stale mark %+v", m)
	}
	// Its room would wait a minute; only the router's cancel frees it.
	simtest.WaitFor(t, "decode-0's leg cancelled", func() bool { return ds[0].Load().Running == 0 })
	b.waitMetric(t, "pdplane_router_stale_marks_total", map[string]string{"cause": "missing_mem_kind"}, 1)
	before := ds[0].Stats().Requests
	for range 4 {
		if resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if n := ds[0].Stats().Requests - before; n != 0 {
		t.Fatalf("stale decode got %d more requests", n)
	}
	if n := len(b.reg.staleEvents(t, "decode-0")); n != 1 {
		t.Fatalf("%d stale marks", n)
	}
}

// TestMemKindAgainAfterReregistrationQuarantines: a decode marked stale
// for the memory-kind error re-registers with a fresh agent and fails the
// same way again with the same prefill (a deterministic mismatch): the
// registry quarantines the pair instead of marking the decode stale again,
// which would loop.
func TestMemKindAgainAfterReregistrationQuarantines(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	setFault(t, d, sim.FaultMissingMemKind)
	b := setupSims(t, router.Config{}, p, d)
	const body = `{"model":"sim-model","prompt":"x","max_tokens":2}`

	// The 502 does not echo the engine's internals to the client.
	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusBadGateway || strings.Contains(string(out), "NIXL") {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	b.reg.waitStale(t, "d0")
	// The decode's agent re-registers it, as a stale mark asks; the defect
	// comes back with the fresh agent.
	if g := b.reg.reregisterSim(t, d, "marked stale").Generation; g != 2 {
		t.Fatalf("generation %d after re-registering", g)
	}
	setFault(t, d, sim.FaultMissingMemKind)

	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	// The registry composes the quarantine's detail; the report carries the
	// engine's error text.
	q := b.reg.waitQuarantine(t)
	if q.PrefillID != b.reg.id(t, "p0") || q.DecodeID != b.reg.id(t, "d0") || !strings.Contains(q.Detail, "Missing NIXL destination KV memory kind") {
		t.Fatalf("quarantine %+v", q)
	}
	if n := len(b.reg.staleEvents(t, "d0")); n != 1 {
		t.Fatalf("%d stale marks; a repeat must quarantine, not loop", n)
	}
	if got := b.reg.peer(t, "d0").State; got != registry.StateReady {
		t.Fatalf("decode %s; only the pair is quarantined", got)
	}
	b.waitMetric(t, "pdplane_router_quarantines_total", nil, 1)
	if n := p.Stats().MissingMemKind; n != 2 {
		t.Fatalf("the prefill raised the memory-kind error %d times, want 2", n)
	}
}

func TestBadInputMakesNoUpstreamCall(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{MaxBodyBytes: 1024}, p, d)
	for _, tc := range []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"malformed", "/v1/chat/completions", `{"model":"sim-model","messages":[`, 400, "invalid_json"},
		{"too large", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, "request_too_large"},
		{"no messages", "/v1/chat/completions", `{"model":"sim-model"}`, 400, "missing_required_parameter"},
		{"no prompt", "/v1/completions", `{"model":"sim-model"}`, 400, "missing_required_parameter"},
		{"no text", "/generate", `{"sampling_params":{}}`, 400, "missing_required_parameter"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-17","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found"},
	} {
		resp, body := b.post(t, tc.path, tc.body)
		e := decodeError(t, body)
		if resp.StatusCode != tc.status || e.Error.Code == nil || *e.Error.Code != tc.code || e.Error.Type != "invalid_request_error" {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
	}
	if n := p.Stats().Requests + d.Stats().Requests; n != 0 {
		t.Fatalf("bad input reached the engines: %d calls", n)
	}
	if got := b.metric(t, "pdplane_router_requests_total", map[string]string{"route": "chat_completions", "outcome": "bad_request"}); got != 4 {
		t.Fatalf("bad_request count %v", got)
	}
}

func TestModelsAndHealth(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{}, p, d)
	r, err := http.Get(b.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy string
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&list); err != nil || list.Object != "list" || len(list.Data) != 1 ||
		list.Data[0].ID != sim.DefaultModel || list.Data[0].Object != "model" {
		t.Fatalf("models %+v %v", list, err)
	}
	r.Body.Close()

	b.reg.markStale(t, "d0")
	r, err = http.Get(b.srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 503 || !strings.Contains(string(out), "no ready decode") {
		t.Fatalf("/health %d %s", r.StatusCode, out)
	}
}

// TestBreakerOpensHalfOpensAndCloses: a prefill that keeps answering 500
// opens its breaker after BreakerFailures, gets no traffic while open, is
// probed after the cool-down (a failed probe opens it again), and a good
// probe once the engine recovers closes it.
func TestBreakerOpensHalfOpensAndCloses(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{
		"p1": registry.RolePrefill, "p2": registry.RolePrefill, "d1": registry.RoleDecode,
	})
	p1 := s["p1"]
	setFault(t, p1, sim.FaultPrefillError)
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, MaxAttempts: 1, BreakerFailures: 2, BreakerCooldown: time.Minute},
		p1, s["p2"], s["d1"])
	req := func() int {
		resp, _ := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`)
		return resp.StatusCode
	}
	state := func() float64 { return b.metric(t, "pdplane_router_breaker_state", map[string]string{"peer": "p1"}) }
	started := func() int64 { return p1.Stats().Requests }

	for i := 0; started() < 2; i++ {
		req()
		if i > 10 {
			t.Fatal("p1 never reached twice")
		}
	}
	if state() != 1 {
		t.Fatalf("breaker state %v after 2 failures, want open (1)", state())
	}
	// What the control plane shows of it: the same state, and when it opened.
	if st, since, ok := b.rt.PeerBreaker(b.reg.id(t, "p1")); st != "open" || since.IsZero() || !ok {
		t.Errorf("PeerBreaker(p1) = %q since %v (%v), want open with its time", st, since, ok)
	}
	if st, _, ok := b.rt.PeerBreaker(b.reg.id(t, "p2")); st != "closed" || !ok {
		t.Errorf("PeerBreaker(p2) = %q (%v), want closed", st, ok)
	}
	if peers, _ := b.rt.OpenBreakers(); peers != 1 {
		t.Errorf("OpenBreakers counts %d peers, want 1", peers)
	}
	for range 6 {
		if s := req(); s != http.StatusOK {
			t.Fatalf("status %d while p1's breaker is open", s)
		}
	}
	if started() != 2 {
		t.Fatalf("open breaker let %d requests through", started()-2)
	}

	// After the cool-down one probe goes through; it fails: open again.
	b.clock.advance(time.Minute)
	for started() < 3 {
		req()
	}
	if state() != 1 {
		t.Fatalf("state %v after a failed probe", state())
	}
	// The engine recovers; the next probe closes the breaker.
	setFault(t, p1, sim.FaultNone)
	b.clock.advance(time.Minute)
	for started() < 4 {
		req()
	}
	if state() != 0 {
		t.Fatalf("state %v after a good probe", state())
	}
	if st, since, _ := b.rt.PeerBreaker(b.reg.id(t, "p1")); st != "closed" || !since.IsZero() {
		t.Errorf("PeerBreaker(p1) after a good probe = %q since %v, want closed", st, since)
	}
	for range 4 {
		req()
	}
	if started() < 5 {
		t.Fatal("p1 got no traffic after its breaker closed")
	}
	if got := b.metric(t, "pdplane_router_breaker_transitions_total", map[string]string{"kind": "peer", "state": "half_open"}); got != 2 {
		t.Fatalf("half-open transitions %v", got)
	}
}

// TestMidStreamFailureEndsWithErrorEvent: a decode that dies after it
// streamed some tokens cannot be retried (the client has them); the stream
// ends with an OpenAI error event and no [DONE], so that no client takes it
// as whole; a /generate stream ends with an error too.
func TestMidStreamFailureEndsWithErrorEvent(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = 20 * time.Millisecond })
	b := setupSims(t, router.Config{}, p, d)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1000,"stream":true}`},
		{"/generate", `{"text":"x","sampling_params":{"max_new_tokens":1000},"stream":true}`},
	} {
		setFault(t, d, sim.FaultNone)
		before := d.Stats().Requests
		resp := b.send(t, context.Background(), tc.path, tc.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", tc.path, resp.StatusCode)
		}
		sr := &sseReader{bufio.NewReader(resp.Body)}
		for range 2 {
			if c := sr.next(t); !strings.HasPrefix(c, "{") {
				t.Fatalf("%s: chunk %s", tc.path, c)
			}
		}
		// The decode's process dies: its connections drop.
		setFault(t, d, sim.FaultCrash)
		rest, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
		last := strings.TrimPrefix(events[len(events)-1], "data: ")
		if strings.Contains(string(rest), "[DONE]") || !strings.Contains(last, `"error"`) {
			t.Fatalf("%s: stream ended with %q", tc.path, rest)
		}
		if tc.path != "/generate" {
			if e := decodeError(t, []byte(last)); e.Error.Code == nil || *e.Error.Code != "upstream_stream_error" {
				t.Fatalf("last event %s", last)
			}
		}
		if n := d.Stats().Requests - before; n != 1 {
			t.Fatalf("%s: retried after the first byte: decode saw %d requests", tc.path, n)
		}
	}
}

// heldPair starts an SGLang pair whose prefill computes for a minute a
// token and whose decode would wait a minute for its KV: a request holds
// both until something ends it.
func heldPair(t *testing.T, engine registry.Engine) (p, d *sim.Sim) {
	t.Helper()
	return simtest.Pair(t, engine, func(c *sim.Config) {
		c.PrefillTimePerToken = time.Minute
		c.DecodeTimePerToken = time.Minute
		c.RoomTimeout = time.Minute
	})
}

// sendInBackground sends body to path until ctx ends, and closes the
// returned channel with the answer's status (0 when none came).
func sendInBackground(ctx context.Context, b *bundle, path, body string) <-chan int {
	done := make(chan int, 1)
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// TestFailedLegCancelsTheOther: when one leg of a pair fails (its engine
// dies) or the client leaves, the router cancels what is left, so that no
// engine keeps working, or holding KV, for a request that is over.
func TestFailedLegCancelsTheOther(t *testing.T) {
	t.Parallel()
	const body = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`
	both := func(p, d *sim.Sim) func() bool {
		return func() bool { return p.Stats().Requests == 1 && d.Stats().Requests == 1 }
	}
	for _, tc := range []struct {
		failing, other string // the leg whose engine dies, the leg cancelled
		path, body     string
	}{
		{"prefill", "decode", "/v1/chat/completions", body},
		{"decode", "prefill", "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`},
	} {
		t.Run(tc.failing+" failure cancels "+tc.other, func(t *testing.T) {
			t.Parallel()
			p, d := heldPair(t, registry.EngineSGLang)
			failing, other := p, d
			if tc.failing == "decode" {
				failing, other = d, p
			}
			b := setupSims(t, router.Config{MaxAttempts: 1}, p, d)
			done := sendInBackground(context.Background(), b, tc.path, tc.body)
			simtest.WaitFor(t, "both legs to arrive", both(p, d))
			setFault(t, failing, sim.FaultCrash)
			if st := <-done; st != http.StatusBadGateway {
				t.Fatalf("status %d", st)
			}
			simtest.WaitFor(t, "the "+tc.other+"'s leg cancelled", func() bool { return other.Load().Running == 0 })
		})
	}
	t.Run("client leaving cancels both", func(t *testing.T) {
		t.Parallel()
		p, d := heldPair(t, registry.EngineSGLang)
		b := setupSims(t, router.Config{}, p, d)
		ctx, cancel := context.WithCancel(context.Background())
		done := sendInBackground(ctx, b, "/v1/chat/completions", body)
		simtest.WaitFor(t, "both legs to arrive", both(p, d))
		cancel()
		<-done
		simtest.WaitFor(t, "both legs cancelled", func() bool { return p.Load().Running == 0 && d.Load().Running == 0 })
		b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "client_gone"}, 1)
	})
	t.Run("vllm client leaving cancels decode", func(t *testing.T) {
		t.Parallel()
		p, d := simtest.Pair(t, registry.EngineVLLM, func(c *sim.Config) { c.DecodeTimePerToken = time.Minute })
		b := setupSims(t, router.Config{}, p, d)
		ctx, cancel := context.WithCancel(context.Background())
		done := sendInBackground(ctx, b, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`)
		simtest.WaitFor(t, "the decode leg to arrive", func() bool { return d.Stats().Requests == 1 })
		cancel()
		<-done
		simtest.WaitFor(t, "the decode's leg cancelled", func() bool { return d.Load().Running == 0 })
	})
}

// TestOverloadMovesOnWithoutOpeningBreaker: a decode refusing work it has
// no KV room for (the simulator's 503 "KV cache pool exhausted" with
// Retry-After) sends the request to another pair without counting against
// the decode's breaker; when every pair is full, the client gets the
// overload with a Retry-After.
func TestOverloadMovesOnWithoutOpeningBreaker(t *testing.T) {
	t.Parallel()
	p := simtest.Start(t, simtest.Config("p1", registry.RolePrefill, registry.EngineSGLang))
	pool := func(name string, pages int) *sim.Sim {
		c := simtest.Config(name, registry.RoleDecode, registry.EngineSGLang)
		c.Pages = pages
		return simtest.Start(t, c)
	}
	d1, d2 := pool("d1", 2), pool("d2", 16) // 8 and 64 tokens of KV
	b := setupSims(t, router.Config{DecodePolicy: router.PolicyRoundRobin, BreakerFailures: 1, MaxAttempts: 2}, p, d1, d2)
	const fitsD2 = `{"model":"sim-model","prompt":"a b c d e f g h i j","max_tokens":2}` // 11 tokens
	for range 6 {
		resp, body := b.post(t, "/v1/completions", fitsD2)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if n := d1.Stats().Requests; n < 3 {
		t.Fatalf("an overloaded decode was taken out of rotation (%d requests)", n)
	}
	if got := b.metric(t, "pdplane_router_breaker_state", map[string]string{"peer": "d1"}); got != 0 {
		t.Fatalf("d1 breaker state %v", got)
	}
	// Every pair overloaded: the client gets 429 or 503 with Retry-After.
	long := `{"model":"sim-model","prompt":"` + strings.TrimSpace(strings.Repeat("w ", 100)) + `","max_tokens":2}`
	resp, body := b.post(t, "/v1/completions", long)
	if (resp.StatusCode != 429 && resp.StatusCode != 503) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
}

// TestQuarantineDecidedElsewhereKeepsTheDecode: the first failure of a pair
// went through another replica, so this router sees only the repeat after
// the decode re-registered. The registry quarantines the pair; this router
// must then stop skipping the decode for its other prefills (it is not
// stale and will not re-register).
func TestQuarantineDecidedElsewhereKeepsTheDecode(t *testing.T) {
	t.Parallel()
	p1 := simtest.Start(t, simtest.Config("p1", registry.RolePrefill, registry.EngineSGLang))
	p2 := simtest.Start(t, simtest.Config("p2", registry.RolePrefill, registry.EngineSGLang))
	dc := simtest.Config("d1", registry.RoleDecode, registry.EngineSGLang)
	dc.RoomTimeout = 500 * time.Millisecond // the by-hand request below waits it out
	d := simtest.Start(t, dc)
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyRoundRobin}, p1, p2, d)
	ctx := context.Background()

	// Another replica reported the pair's first failure: the registry
	// quarantined the pair and held the decode's heal plan (p2 still
	// uses it), and the decode re-registered with a fresh agent.
	first := b.reg.peer(t, "d1")
	if _, out, err := b.reg.store.ReportTransferFailure(ctx, registry.TransferFailure{
		PrefillID: b.reg.id(t, "p1"), DecodeID: first.ID, DecodeAgent: first.Ranks[0].AgentName,
		Reason: "prefill p1 could not send KV", Error: "Missing NIXL destination KV memory kind", Reporter: "router:elsewhere",
	}); err != nil || out != registry.OutcomeHealPending {
		t.Fatalf("first failure: %v %v", out, err)
	}
	b.reg.reregisterSim(t, d, "marked stale")
	// The fresh agent's registration with p1 (only) goes wrong again: one
	// request by hand through p1 while the fault holds.
	setFault(t, d, sim.FaultMissingMemKind)
	if _, _, err := simtest.NewClient().SGLang(ctx, p1, d, "/v1/completions",
		map[string]any{"model": "sim-model", "prompt": "x", "max_tokens": 2}, simtest.Room()); err != nil {
		t.Fatal(err)
	}
	setFault(t, d, sim.FaultNone)
	if n := p1.Stats().MissingMemKind; n != 1 {
		t.Fatalf("p1 raised the memory-kind error %d times", n)
	}

	// Round robin reaches p1 within two requests; their answers do not
	// matter here (the retry may run before the registry has answered).
	for range 2 {
		b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`)
	}
	if n := p1.Stats().MissingMemKind; n != 2 {
		t.Fatalf("p1 raised the memory-kind error %d times, want 2", n)
	}
	if q := b.reg.waitQuarantine(t); q.PrefillID != b.reg.id(t, "p1") || q.DecodeID != b.reg.id(t, "d1") {
		t.Fatalf("quarantine %+v", q)
	}
	// The decode stays routable from p2 on this router.
	simtest.WaitFor(t, "the decode routed again from p2", func() bool {
		resp, _ := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`)
		return resp.StatusCode == http.StatusOK
	})
	if n := len(b.reg.staleEvents(t, "d1")); n != 0 {
		t.Fatalf("%d stale marks, want none: the first failure held the heal plan (p2 kept the decode), the repeat quarantined the pair", n)
	}
	if got := b.reg.peer(t, "d1").State; got != registry.StateReady {
		t.Fatalf("decode %s after the quarantine of one pair", got)
	}
}

// brokenPairFleet is two SGLang prefills and one decode behind a router of
// cfg, the decode's registration broken on p1 only (SGLang's entry is per
// (prefill, decode agent): the sim's pair-limited fault).
func brokenPairFleet(t *testing.T, cfg router.Config) (b *bundle, p1, p2, d *sim.Sim) {
	t.Helper()
	p1 = simtest.Start(t, simtest.Config("p1", registry.RolePrefill, registry.EngineSGLang))
	p2 = simtest.Start(t, simtest.Config("p2", registry.RolePrefill, registry.EngineSGLang))
	dc := simtest.Config("d1", registry.RoleDecode, registry.EngineSGLang)
	dc.RoomTimeout = time.Minute // only the router's cancel frees the broken pair's room
	d = simtest.Start(t, dc)
	b = setupSims(t, cfg, p1, p2, d)
	if err := d.SetPairFault(sim.FaultMissingMemKind, p1.BootstrapPort()); err != nil {
		t.Fatal(err)
	}
	return b, p1, p2, d
}

// TestBrokenPairRetriesTheDecodeWithAnotherPrefill re-runs the reliability
// core's first scenario: two prefills, one decode, and the decode's
// registration broken on one prefill only (SGLang's entry is per (prefill,
// decode agent): the sim's pair-limited fault). No request fails: the one
// that lands on the broken pair is retried on the healthy one, the same
// decode with the other prefill. The registry quarantines the pair only,
// and the decode stays ready.
func TestBrokenPairRetriesTheDecodeWithAnotherPrefill(t *testing.T) {
	t.Parallel()
	b, p1, p2, _ := brokenPairFleet(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, MaxAttempts: 2})
	for i := range 6 {
		body := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`
		if resp, got := b.post(t, "/v1/chat/completions", body); resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, got)
		}
	}
	if n := p1.Stats().MissingMemKind; n == 0 {
		t.Fatal("no request was routed to the broken pair")
	}
	if n := p2.Stats().MissingMemKind; n != 0 {
		t.Fatalf("the healthy prefill raised the memory-kind error %d times", n)
	}
	if q := b.reg.waitQuarantine(t); q.PrefillID != b.reg.id(t, "p1") || q.DecodeID != b.reg.id(t, "d1") {
		t.Fatalf("quarantine %+v, want the pair (p1, d1)", q)
	}
	if got := b.reg.peer(t, "d1").State; got != registry.StateReady {
		t.Fatalf("the decode is %s after one of its pairs broke, want ready", got)
	}
}

// TestLiftedPairRoutesAtOnce: a pair the registry quarantined and the
// router's breaker holds open routes again as soon as an operator lifts the
// quarantine, not after the breaker's cool-down (an hour here): the
// registry owns the pair's state, and its lift resets what the router holds
// against the pair.
func TestLiftedPairRoutesAtOnce(t *testing.T) {
	t.Parallel()
	b, p1, _, d := brokenPairFleet(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, MaxAttempts: 2, BreakerCooldown: time.Hour})
	const unary = `{"model":"sim-model","prompt":"x","max_tokens":2}`
	for p1.Stats().MissingMemKind == 0 {
		if resp, body := b.post(t, "/v1/completions", unary); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	q := b.reg.waitQuarantine(t)
	setFault(t, d, sim.FaultNone)
	if err := b.reg.store.LiftQuarantine(context.Background(), q.PrefillID, q.DecodeID, "operator"); err != nil {
		t.Fatal(err)
	}
	before := p1.Stats().Requests
	simtest.WaitFor(t, "the lifted pair routed again", func() bool {
		if resp, body := b.post(t, "/v1/completions", unary); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return p1.Stats().Requests > before
	})
}

// TestRefusedConnectionOpensTheBreakerAtOnce: a decode that is registered
// but whose port refuses connections (a crashed engine, before its agent
// notices) costs one attempt, not BreakerFailures of them: its breaker
// opens on the first refusal, the request moves on, and no client sees it.
func TestRefusedConnectionOpensTheBreakerAtOnce(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			b, _, ds := simFleet(t, engine, router.Config{BreakerFailures: 5, BreakerCooldown: time.Hour}, nil)
			ds[0].Close()
			for i := range 6 {
				if resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`); resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
				}
			}
			if got := b.metric(t, "pdplane_router_breaker_state", map[string]string{"peer": "decode-0"}); got != 1 {
				t.Fatalf("the refusing decode's breaker is %v, want open (1) after its first refusal", got)
			}
			if got := b.metric(t, "pdplane_router_retries_total", map[string]string{"reason": "transport"}); got != 1 {
				t.Fatalf("%v retries after transport failures, want 1: the open breaker keeps the decode out of later picks", got)
			}
		})
	}
}

// TestRouteReceipt: with Config.RouteReceipt every routed answer says
// which pair served it, with both generations, and which attempts failed
// before it and why.
func TestRouteReceipt(t *testing.T) {
	t.Parallel()
	b, _, _, _ := brokenPairFleet(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, MaxAttempts: 2, RouteReceipt: true})
	seen := map[string]bool{}
	for range 6 {
		resp, body := b.post(t, "/v1/chat/completions", chatStream)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get(router.RouteReceiptHeader)] = true
	}
	for _, want := range []string{
		"prefill=p2@1 decode=d1@1 attempts=1",
		"prefill=p2@1 decode=d1@1 attempts=2 failed=missing_mem_kind:p1>d1",
	} {
		if !seen[want] {
			t.Errorf("no answer had the receipt %q; seen %v", want, seen)
		}
	}
}

// TestPairCounters: a vLLM pair's served requests are counted per pair:
// its attempts, and the KV blocks its prefill handed the decode (also in
// the route receipt).
func TestPairCounters(t *testing.T) {
	t.Parallel()
	b, _, _ := simFleet(t, registry.EngineVLLM, router.Config{RouteReceipt: true, DecodePolicy: router.PolicyRoundRobin}, nil)
	prompt := strings.Repeat("kv ", 40)
	resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"`+prompt+`","max_tokens":2}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	receipt := resp.Header.Get(router.RouteReceiptHeader)
	m := regexp.MustCompile(`^prefill=prefill-0@1 decode=(decode-\d)@1 attempts=1 kv_blocks=(\d+)$`).FindStringSubmatch(receipt)
	if m == nil || m[2] == "0" {
		t.Fatalf("route receipt %q: want the pair and its KV blocks", receipt)
	}
	pair := map[string]string{"prefill": "prefill-0", "decode": m[1]}
	blocks, _ := strconv.Atoi(m[2])
	if got := b.metric(t, "pdplane_router_pair_kv_blocks_total", pair); got != float64(blocks) {
		t.Errorf("pair_kv_blocks_total%v = %v, want %d", pair, got, blocks)
	}
	ok := map[string]string{"prefill": pair["prefill"], "decode": pair["decode"], "result": "ok"}
	if got := b.metric(t, "pdplane_router_pair_attempts_total", ok); got != 1 {
		t.Errorf("pair_attempts_total%v = %v, want 1", ok, got)
	}
}

// TestServedPairsReachTheRegistry: the pairs a router served reach its
// store (an ExchangeReporter) within a report interval, each with the time
// of its latest request, so that the registry knows which pairs exchanged
// KV last; the pair that served nothing (the other decode) is not
// reported.
func TestServedPairsReachTheRegistry(t *testing.T) {
	t.Parallel()
	b, _, _ := simFleet(t, registry.EngineSGLang, router.Config{ExchangeReportInterval: 10 * time.Millisecond, DecodePolicy: router.PolicyRoundRobin}, nil)
	peers, err := b.reg.store.List(context.Background(), registry.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, p := range peers {
		ids[p.Name] = p.ID
	}
	before := time.Now()
	if resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var xs []registry.Exchange
	simtest.WaitFor(t, "the served pair reported", func() bool {
		var err error
		xs, err = b.reg.store.Exchanges(context.Background())
		return err == nil && len(xs) > 0
	})
	if len(xs) != 1 || xs[0].PrefillID != ids["prefill-0"] || (xs[0].DecodeID != ids["decode-0"] && xs[0].DecodeID != ids["decode-1"]) ||
		xs[0].At.Before(before) || xs[0].At.After(time.Now()) {
		t.Fatalf("exchanges %+v: want the one pair served, at the time of its request", xs)
	}
}
