package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// Fault is a failure the simulator can be told to show.
type Fault string

// Faults.
const (
	// FaultNone: behave.
	FaultNone Fault = "none"
	// FaultMissingMemKind (decodes): SGLang — the decode takes a fresh NIXL
	// agent (as a restart of its KV manager would; the control plane is not
	// told) and sends its KV args to each prefill without the memory-kinds
	// frame, as a decode predating per-region kinds does. The prefill reads
	// them as VRAM (KVArgsRegisterInfo.from_zmq), enters them in its table,
	// and fails to prepare a VRAM destination over the decode's DRAM: the
	// entry stays with neither a homogeneous kind nor segments, and every
	// transfer to the agent raises *transfer.MissingMemKindError, calls
	// OnTransferError and aborts the request the way SGLang does ("Prefill
	// transfer failed ... with exception Missing NIXL destination KV memory
	// kind"): 500 when not streamed, 200 then an error event (OpenAI
	// routes) or an abort event (/generate) when streamed. The decode is
	// not told and waits out its room timeout. Its later registrations
	// under the same agent name are ignored ("Peer … was already
	// registered, ignoring."), so clearing the fault changes nothing: only
	// Reregister (a fresh agent, registered with its kinds) heals it. vLLM —
	// the decode's own read-side preparation of each prefill fails the same
	// way, is reported, and the decode answers as vLLM does under
	// kv_load_failure_policy=fail ("Internal server error"), never with
	// SGLang's text; it lasts until Reregister. On an SGLang decode it may
	// be limited to one prefill (SetPairFault): SGLang's broken entry is
	// per (prefill, decode agent), so only toward that prefill does the
	// decode take a fresh agent, registered there without the kinds; the
	// other prefills keep sending to its own agent, as registered with the
	// control plane.
	FaultMissingMemKind Fault = "missing-mem-kind"
	// FaultPrefillError: every generation request is answered with an
	// ordinary HTTP 500.
	FaultPrefillError Fault = "prefill-error"
	// FaultSlow multiplies the per-token times by 10; a zero decode time
	// counts as 1ms a token and a zero prefill time as 100µs a token.
	FaultSlow Fault = "slow"
	// FaultCrash: the engine stops answering: connections are dropped
	// without a response, requests in flight are cut, until FaultNone. Only
	// POST /_sim/fault still answers.
	FaultCrash Fault = "crash"
	// FaultCorruptKV (prefills): the computed KV has a wrong byte in every
	// page, so that the decode's verification fails.
	FaultCorruptKV Fault = "corrupt-kv"
	// FaultHang: a wedged engine. It accepts every connection and request,
	// /health included, and never answers; a request ends only when its
	// client leaves (or the fault is lifted: then the connection is closed
	// unanswered). Only POST /_sim/fault, and an SGLang prefill's
	// bootstrap server (a process of its own in SGLang), still answer.
	FaultHang Fault = "hang"
	// FaultGarbage: every generation request is answered 200 with bytes
	// that are neither JSON nor SSE (Content-Type text/plain), streamed or
	// not, as a broken engine or a proxy in front of it might answer.
	FaultGarbage Fault = "garbage"
	// FaultStallTransfer (SGLang prefills): the prefill computes the KV and
	// then never sends it, nor answers, until the client leaves; its decode
	// waits for the KV, as a real one whose transfer stalled does.
	FaultStallTransfer Fault = "stall-transfer"
	// FaultRecompute (vLLM decodes): the decode does not load the
	// prefill's KV but computes the prompt itself and answers as if
	// nothing happened, as vLLM does after a failed load under
	// kv_load_failure_policy=recompute (v1/core/sched/scheduler.py
	// recompute_kv_load_failures). Only its counters tell: the prompt
	// tokens go to source="local_compute" and the failed READ to
	// vllm:nixl_num_failed_transfers. The prefill's blocks are released.
	FaultRecompute Fault = "recompute"
)

// Faults returns the known faults.
func Faults() []Fault {
	return []Fault{FaultNone, FaultMissingMemKind, FaultPrefillError, FaultSlow, FaultCrash, FaultCorruptKV,
		FaultHang, FaultGarbage, FaultStallTransfer, FaultRecompute}
}

const faultPath = "/_sim/fault"

// InvalidFaultError refuses a fault by name or for this role.
type InvalidFaultError struct {
	Fault  Fault
	Detail string
}

func (e *InvalidFaultError) Error() string { return fmt.Sprintf("fault %q: %s", e.Fault, e.Detail) }

// Fault returns the fault in effect.
func (s *Sim) Fault() Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	if s.fault == "" {
		return FaultNone
	}
	return s.fault
}

// SetFault puts f in effect, replacing the previous fault.
func (s *Sim) SetFault(f Fault) error { return s.SetPairFault(f, 0) }

// SetPairFault puts f in effect, replacing the previous fault; a
// bootstrapPort other than zero limits the missing-mem-kind fault of an
// SGLang decode to the pair with the prefill whose bootstrap server
// listens on that port.
func (s *Sim) SetPairFault(f Fault, bootstrapPort int) error {
	if bootstrapPort != 0 && (f != FaultMissingMemKind || s.cfg.Engine != registry.EngineSGLang) {
		return &InvalidFaultError{Fault: f, Detail: "bootstrap_port applies to the missing-mem-kind fault of an SGLang decode"}
	}
	if bootstrapPort < 0 || bootstrapPort > 65535 {
		return &InvalidFaultError{Fault: f, Detail: fmt.Sprintf("bootstrap_port must be in [1, 65535], got %d", bootstrapPort)}
	}
	known := false
	for _, k := range Faults() {
		known = known || k == f
	}
	if !known {
		return &InvalidFaultError{Fault: f, Detail: fmt.Sprintf("unknown fault (want one of %v)", Faults())}
	}
	if f == FaultMissingMemKind && s.cfg.Role != registry.RoleDecode {
		return &InvalidFaultError{Fault: f, Detail: "applies to decodes: it breaks a decode's registration on the prefill side"}
	}
	if f == FaultCorruptKV && s.cfg.Role != registry.RolePrefill {
		return &InvalidFaultError{Fault: f, Detail: "applies to prefills: they compute the KV"}
	}
	if f == FaultStallTransfer && (s.cfg.Role != registry.RolePrefill || s.cfg.Engine != registry.EngineSGLang) {
		return &InvalidFaultError{Fault: f, Detail: "applies to SGLang prefills: they send the KV"}
	}
	if f == FaultRecompute && (s.cfg.Role != registry.RoleDecode || s.cfg.Engine != registry.EngineVLLM) {
		return &InvalidFaultError{Fault: f, Detail: "applies to vLLM decodes: they load the KV, and only vLLM can fall back to computing it"}
	}
	s.faultMu.Lock()
	prev := s.fault
	s.fault, s.faultPort = f, bootstrapPort
	switch {
	case f == FaultCrash && prev != FaultCrash:
		s.crashCancel()
	case f != FaultCrash && prev == FaultCrash:
		s.crashCtx, s.crashCancel = context.WithCancel(context.Background())
	}
	s.faultMu.Unlock()
	switch {
	case f == FaultMissingMemKind && bootstrapPort != 0:
		if err := s.breakPair(bootstrapPort); err != nil {
			return err
		}
	case f == FaultMissingMemKind:
		if err := s.breakRegistrations(); err != nil {
			return err
		}
	}
	s.log.Warn().Str("fault", string(f)).Int("bootstrap_port", bootstrapPort).Str("previous", string(prev)).Msg("fault set")
	return nil
}

// breaksPair reports whether the fault in effect breaks the registration
// of this decode with the prefill whose bootstrap server listens on port.
func (s *Sim) breaksPair(port int) bool {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return s.fault == FaultMissingMemKind && (s.faultPort == 0 || s.faultPort == port)
}

// hung reports whether the hang fault is in effect.
func (s *Sim) hung() bool { return s.Fault() == FaultHang }

// hang holds a request of a hung engine until its client leaves, the
// fault is lifted or the sim closes; then the connection is closed
// without an answer.
func (s *Sim) hang(r *http.Request) {
	t := time.NewTicker(50 * time.Millisecond) // the fault has no channel to wait on: look whether it lifted
	defer t.Stop()
	for s.hung() {
		select {
		case <-r.Context().Done():
			panic(http.ErrAbortHandler)
		case <-s.ctx.Done():
			panic(http.ErrAbortHandler)
		case <-t.C:
		}
	}
	panic(http.ErrAbortHandler)
}

// crashed reports whether the crash fault is in effect.
func (s *Sim) crashed() bool { return s.Fault() == FaultCrash }

// requestContext is r's context, also cancelled when the sim "crashes".
func (s *Sim) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	s.faultMu.Lock()
	crash := s.crashCtx
	s.faultMu.Unlock()
	stop := context.AfterFunc(crash, cancel)
	return ctx, func() { stop(); cancel() }
}

// perToken is a per-token time under the current fault; floor stands in
// for a zero time when slowed.
func (s *Sim) perToken(d, floor time.Duration) time.Duration {
	if s.Fault() == FaultSlow {
		return 10 * max(d, floor)
	}
	return d
}

// decodeTime and prefillTime are the per-token times in effect.
func (s *Sim) decodeTime() time.Duration {
	return s.perToken(s.cfg.DecodeTimePerToken, time.Millisecond)
}

func (s *Sim) prefillTime() time.Duration {
	return s.perToken(s.cfg.PrefillTimePerToken, 100*time.Microsecond)
}

// problem is an RFC 9457 problem, for the simulator's own endpoints.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field,omitempty"`
}

func writeProblem(w http.ResponseWriter, p problem) {
	b, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}

type faultBody struct {
	Fault Fault `json:"fault"`
	// BootstrapPort limits the missing-mem-kind fault to one prefill's
	// pair (SetPairFault); zero: every pair.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
}

func (s *Sim) handleSetFault(w http.ResponseWriter, r *http.Request) {
	var body faultBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&body); err != nil {
		writeProblem(w, problem{Type: "https://pdplane.dev/problems/malformed-request", Title: "Malformed request", Status: http.StatusBadRequest, Detail: "the body must be {\"fault\": \"...\"}: " + err.Error()})
		return
	}
	if err := s.SetPairFault(body.Fault, body.BootstrapPort); err != nil {
		field := "fault"
		if body.BootstrapPort != 0 {
			field = "bootstrap_port"
		}
		writeProblem(w, problem{Type: "https://pdplane.dev/problems/invalid-field", Title: "Invalid fault", Status: http.StatusBadRequest, Detail: err.Error(), Field: field})
		return
	}
	s.handleGetFault(w, r)
}

func (s *Sim) handleGetFault(w http.ResponseWriter, _ *http.Request) {
	s.faultMu.Lock()
	body := faultBody{Fault: s.fault, BootstrapPort: s.faultPort}
	s.faultMu.Unlock()
	if body.Fault == "" {
		body.Fault = FaultNone
	}
	writeJSON(w, body)
}

// counters are the simulator's statistics.
type counters struct {
	requests        atomic.Int64
	errors          atomic.Int64
	verifyFailures  atomic.Int64
	transfers       atomic.Int64
	transferErrors  atomic.Int64
	missingMemKind  atomic.Int64
	bytesMoved      atomic.Int64
	reregistrations atomic.Int64
	ignoredKVArgs   atomic.Int64
	foreignMessages atomic.Int64
	roomTimeouts    atomic.Int64
	// The prompt tokens an engine computed, those a prefill found in its
	// prefix cache, and those a vLLM decode received by KV transfer
	// (vllm:prompt_tokens_by_source_total); the requests it answered
	// (vllm:request_success_total).
	promptComputed, promptCached, promptTransferred, succeeded atomic.Int64

	fromMu sync.Mutex
	from   map[string]int64 // KV received by an SGLang decode, by prefill
}

// received counts a transfer an SGLang decode received from the prefill
// whose bootstrap server is at addr.
func (c *counters) received(addr string) {
	c.fromMu.Lock()
	defer c.fromMu.Unlock()
	if c.from == nil {
		c.from = map[string]int64{}
	}
	c.from[addr]++
}

// Stats is what a simulator has done, for tests and GET /_sim/stats.
type Stats struct {
	Name           string `json:"name"`
	Role           string `json:"role"`
	Engine         string `json:"engine"`
	Agent          string `json:"agent"`
	Generation     int64  `json:"generation"`
	Fault          Fault  `json:"fault"`
	Requests       int64  `json:"requests"`
	Errors         int64  `json:"errors"`
	VerifyFailures int64  `json:"verify_failures"`
	Transfers      int64  `json:"transfers"`
	// TransfersFrom counts the transfers an SGLang decode received, by
	// the bootstrap address (host:port) of the prefill that sent them.
	TransfersFrom   map[string]int64 `json:"transfers_from,omitempty"`
	TransferErrors  int64            `json:"transfer_errors"`
	MissingMemKind  int64            `json:"missing_mem_kind"`
	BytesMoved      int64            `json:"bytes_moved"`
	Reregistrations int64            `json:"reregistrations"`
	// IgnoredKVArgs counts KV-args registrations an SGLang prefill ignored
	// because it knew the agent name ("Peer … was already registered,
	// ignoring.").
	IgnoredKVArgs int64 `json:"ignored_kv_args"`
	// ForeignMessages counts messages on the rank socket that did not
	// start with SGLang's guard frame, or could not be read.
	ForeignMessages int64 `json:"foreign_messages"`
	RoomTimeouts    int64 `json:"room_timeouts"`
	// PromptTokens and CachedPromptTokens are the prompt tokens a
	// prefill looked up in its prefix cache and those it found there
	// (vLLM's prefix_cache_queries and prefix_cache_hits); 0 on a decode.
	PromptTokens       int64   `json:"prompt_tokens"`
	CachedPromptTokens int64   `json:"cached_prompt_tokens"`
	Running            int     `json:"running"`
	Queued             int     `json:"queued"`
	KVUsage            float64 `json:"kv_usage"`
	// Remotes are the peers whose agents this sim has loaded: the decodes
	// a prefill writes to (SGLang), the prefills a decode reads from
	// (vLLM).
	Remotes []RemoteAgent `json:"remotes"`
}

// RemoteAgent is a loaded remote agent.
type RemoteAgent struct {
	Key        string `json:"key"`
	Agent      string `json:"agent"`
	Generation int64  `json:"generation"`
}

// Stats returns the simulator's statistics.
func (s *Sim) Stats() Stats {
	c := &s.counters
	l := s.Load()
	st := Stats{
		Name: s.cfg.Name, Role: string(s.cfg.Role), Engine: string(s.cfg.Engine),
		Agent: s.AgentName(), Generation: s.Generation(), Fault: s.Fault(),
		Requests: c.requests.Load(), Errors: c.errors.Load(), VerifyFailures: c.verifyFailures.Load(),
		Transfers: c.transfers.Load(), TransferErrors: c.transferErrors.Load(), MissingMemKind: c.missingMemKind.Load(),
		BytesMoved: c.bytesMoved.Load(), Reregistrations: c.reregistrations.Load(),
		IgnoredKVArgs: c.ignoredKVArgs.Load(), ForeignMessages: c.foreignMessages.Load(), RoomTimeouts: c.roomTimeouts.Load(),
		Running: l.Running, Queued: l.Queued, KVUsage: l.KVUsage,
		Remotes: []RemoteAgent{},
	}
	if s.cache != nil {
		cs := s.cache.stats()
		st.PromptTokens, st.CachedPromptTokens = cs.queried, cs.hit
	}
	c.fromMu.Lock()
	st.TransfersFrom = maps.Clone(c.from)
	c.fromMu.Unlock()
	if cur := s.state.Load(); cur != nil {
		var cache *transfer.RemoteCache
		var keys []string
		switch {
		case cur.worker != nil:
			cache, keys = cur.worker.Cache(), s.decodes.keys()
		case cur.reads != nil:
			cache, keys = cur.reads, cur.reads.Keys()
		}
		for _, k := range keys {
			if a, g, ok := cache.Loaded(k); ok {
				st.Remotes = append(st.Remotes, RemoteAgent{Key: k, Agent: a, Generation: g})
			}
		}
		sort.Slice(st.Remotes, func(i, j int) bool { return st.Remotes[i].Key < st.Remotes[j].Key })
	}
	return st
}
