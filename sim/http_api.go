package sim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// maxBody bounds a generation request body.
const maxBody = 16 << 20

// routes is the engine's HTTP API.
func (s *Sim) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleGen(routeChat))
	mux.HandleFunc("POST /v1/completions", s.handleGen(routeCompletions))
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", s.handleHealth)
	if s.cfg.Engine == registry.EngineVLLM {
		mux.HandleFunc("GET /metrics", s.handleVLLMMetrics)
		mux.HandleFunc("GET /version", s.handleVersion)
		mux.HandleFunc("POST /tokenize", s.handleVLLMTokenize)
	}
	if s.cfg.Engine == registry.EngineSGLang {
		mux.HandleFunc("GET /health_generate", s.handleHealth)
		mux.HandleFunc("GET /v1/loads", s.handleLoads)
		mux.HandleFunc("GET /get_load", s.handleGetLoad)
		mux.HandleFunc("POST /generate", s.handleGen(routeGenerate))
		mux.HandleFunc("GET /get_model_info", s.handleModelInfo)
		mux.HandleFunc("GET /model_info", s.handleModelInfo) // newer SGLang's name
		mux.HandleFunc("GET /server_info", s.handleServerInfo)
		mux.HandleFunc("GET /get_server_info", s.handleServerInfo)
		mux.HandleFunc("GET /metrics", s.handleSGLangMetrics)
		mux.HandleFunc("POST /v1/tokenize", s.handleSGLangTokenize)
		mux.HandleFunc("POST /tokenize", s.handleSGLangTokenize)
	}
	mux.HandleFunc("POST "+faultPath, s.handleSetFault)
	mux.HandleFunc("GET "+faultPath, s.handleGetFault)
	mux.HandleFunc("GET /_sim/stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.Stats()) })
	mux.HandleFunc("POST /_sim/cache_probe", s.handleCacheProbe)
	return mux
}

// httpError is how a generation request failed: the status and message the
// client gets, and the cause the log gets.
type httpError struct {
	status int
	msg    string
	typ    string
	param  string // vLLM's error param: the request member at fault
	cause  error
	// abort: the engine failed the request once it was running (SGLang's
	// scheduler aborts it; vLLM finishes it with an error), so a streamed
	// request has had its 200 and gets the failure as an event.
	abort bool
}

func (e *httpError) Error() string { return e.msg }

// errCancelled: the client (the router) cancelled the request; nothing is
// written.
var errCancelled = &httpError{status: 499, msg: "request cancelled"}

func badRequestErr(err error) *httpError {
	return &httpError{status: http.StatusBadRequest, msg: err.Error(), typ: "BadRequestError", cause: err}
}

func internalErr(msg string, cause error) *httpError {
	return &httpError{status: http.StatusInternalServerError, msg: msg, typ: "InternalServerError", cause: cause}
}

// abortErr is a request the engine failed while running it: status 500.
func abortErr(msg string, cause error) *httpError {
	return &httpError{status: http.StatusInternalServerError, msg: msg, typ: "InternalServerError", cause: cause, abort: true}
}

var errPoolFull = &httpError{status: http.StatusServiceUnavailable, msg: "KV cache pool exhausted", typ: "ServiceUnavailable"}

func (s *Sim) handleGen(rt route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, done := s.requestContext(r)
		defer done()
		s.counters.requests.Add(1)
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				s.fail(ctx, w, nil, &httpError{status: http.StatusRequestEntityTooLarge, msg: "request body too large", typ: "BadRequestError"})
				return
			}
			s.fail(ctx, w, nil, errCancelled)
			return
		}
		if s.cfg.LogRequests {
			s.received.add(r, body)
		}
		q, err := parseRequest(rt, body, &s.cfg)
		if err != nil {
			s.fail(ctx, w, nil, badRequestErr(err))
			return
		}
		if id := r.Header.Get(pdproto.RequestIDHeader); id != "" {
			q.rid = id
		} else if q.rid == "" {
			q.rid = s.nextID()
		}
		s.running.Add(1)
		defer s.running.Add(-1)

		check := needBootstrap
		if s.cfg.Engine == registry.EngineVLLM {
			check = s.vllmCheck
		}
		if e := check(q); e != nil {
			s.fail(ctx, w, nil, e)
			return
		}
		if s.Fault() == FaultGarbage {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("\x00\xffnot an answer\r\n<html>502</html>\n"))
			return
		}
		if s.Fault() == FaultPrefillError {
			// The ordinary HTTP 500 of the fault comes before anything
			// is accepted, streamed or not.
			s.fail(ctx, w, q, internalErr("simulated engine failure", errors.New("prefill-error fault")))
			return
		}
		if q.stream && (s.cfg.Engine == registry.EngineVLLM || rt == routeGenerate) {
			// A StreamingResponse sends its status and headers before
			// the generator yields anything: SGLang's http_server.py
			// generate_request (stream_results) and vLLM's api_server
			// create_chat_completion / create_completion return one as
			// soon as the request is accepted, so a failure after this
			// point (a transfer, a room timeout, a full pool) is an
			// event. SGLang's OpenAI routes do not: serving_chat's and
			// serving_completions' _handle_streaming_request
			// "kick-start" the generator and send the 200 only with its
			// first chunk, which answer.stream or writeFailure writes.
			startStream(w)
			q.streaming = true
		}

		var (
			ans     *answer
			release func()
			herr    *httpError
		)
		switch {
		case s.cfg.Engine == registry.EngineVLLM && s.cfg.Role == registry.RolePrefill:
			ans, release, herr = s.vllmPrefill(ctx, q)
		case s.cfg.Engine == registry.EngineVLLM:
			ans, release, herr = s.vllmDecode(ctx, q)
		case s.cfg.Role == registry.RolePrefill:
			ans, release, herr = s.sglangPrefill(ctx, q)
		default:
			ans, release, herr = s.sglangDecode(ctx, q)
		}
		if release != nil {
			defer release()
		}
		if herr != nil {
			if s.cfg.Role == registry.RolePrefill {
				// Give up the request's rooms. An SGLang decode is not
				// told why (the NIXL decode polls only for its KV): it
				// waits out its own timeout, as a real one does.
				for _, bs := range q.bootstrap {
					s.preRooms.fail(bs.room)
				}
			}
			s.fail(ctx, w, q, herr)
			return
		}
		ans.model = q.model
		ans.created = s.cfg.Now().Unix()
		ans.vllm = s.cfg.Engine == registry.EngineVLLM && rt != routeGenerate
		if ans.id == "" {
			prefix := "cmpl-"
			if rt == routeChat {
				prefix = "chatcmpl-"
			}
			ans.id = prefix + q.rid
			if rt == routeGenerate {
				ans.id = q.rid
			}
		}
		pause := s.tokenPause(ans)
		if !q.stream {
			if !sleepCtx(ctx, answerTime(pause, ans.longest())) {
				s.fail(ctx, w, q, errCancelled)
				return
			}
			ans.write(w, q)
			s.counters.succeeded.Add(int64(len(ans.seqs)))
			return
		}
		if !ans.stream(ctx, w, q, pause) {
			if s.crashed() {
				panic(http.ErrAbortHandler)
			}
			return
		}
		s.counters.succeeded.Add(int64(len(ans.seqs)))
	}
}

// fail answers a failed generation request (q is nil when it could not be
// parsed), unless the client is gone (nothing to answer) or the sim is
// "crashed" (answer nothing at all).
func (s *Sim) fail(ctx context.Context, w http.ResponseWriter, q *genRequest, e *httpError) {
	if s.crashed() {
		panic(http.ErrAbortHandler)
	}
	if e == errCancelled || ctx.Err() != nil {
		s.log.Debug().Msg("request cancelled by the client")
		return
	}
	s.counters.errors.Add(1)
	ev := s.log.Warn()
	if e.status < 500 {
		ev = s.log.Debug()
	}
	ev.Err(e.cause).Int("status", e.status).Str("message", e.msg).Msg("request failed")
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	s.writeFailure(w, q, e)
}

// transferFailed counts a failed transfer, reports it (when report) and
// returns the engine's failure, its message the exception's
// text: SGLang's exact "Missing NIXL destination KV memory kind" when the
// destination's memory kind is missing. The caller puts it in the engine's
// words (pdproto's SGLang messages; vLLM's generation error).
func (s *Sim) transferFailed(report bool, peerID, agentName string, err error) *httpError {
	s.counters.transferErrors.Add(1)
	if report && !errors.Is(err, context.Canceled) && !errors.Is(err, transfer.ErrStaleGeneration) {
		s.onTransferError(peerID, agentName, err)
	}
	var mk *transfer.MissingMemKindError
	if errors.As(err, &mk) {
		s.counters.missingMemKind.Add(1)
		return abortErr(mk.Error(), err)
	}
	return abortErr("KVTransferError: "+err.Error(), err)
}

// waitTurn waits for prompt's turn at the engine's compute (computeQueue),
// counted as queued meanwhile; the caller allocates the prompt's pages once
// it has its turn, as an engine allocates a request's KV when it schedules
// it, and calls compute, or the turn's done if it gives up before.
func (s *Sim) waitTurn(ctx context.Context, prompt []int) (*turn, *httpError) {
	uncached := len(prompt)
	if s.cache != nil {
		uncached -= s.cache.peek(prompt)
	}
	t, err := s.computeQ.enter(ctx, uncached)
	if err != nil {
		return nil, errCancelled
	}
	return t, nil
}

// compute "runs" the prompt in its turn t: the prefill time of the tokens
// the prefix cache does not hold, then the KV bytes into pages (all of
// them: the pages are the request's own, the cache a model), then the
// prompt's blocks into the cache. The turn is done when it returns.
func (s *Sim) compute(ctx context.Context, t *turn, prompt []int, seeds []uint64, pages []int) *httpError {
	defer t.done()
	hit := 0
	if s.cache != nil {
		hit = s.cache.lookup(prompt)
	}
	t.setUncached(len(prompt) - hit)
	s.counters.promptComputed.Add(int64(len(prompt) - hit))
	s.counters.promptCached.Add(int64(hit))
	if !sleepCtx(ctx, s.prefillTime()*time.Duration(len(prompt)-hit)) {
		return errCancelled
	}
	if !s.cfg.CheapTransfer {
		s.pool.fill(seeds, pages)
		if s.Fault() == FaultCorruptKV {
			s.pool.corrupt(pages)
		}
	}
	if s.cache != nil {
		s.cache.insert(prompt)
	}
	return nil
}

// seqFor is the answer to prompt when generating up to q's limit.
func (q *genRequest) seqFor(prompt []int, seeds []uint64, n int) seq {
	finish := "stop"
	if q.explicitMax || n < q.maxTokens {
		finish = "length"
	}
	return newSeq(prompt, seeds, n, finish)
}

// local serves a request without a PD split: compute the KV into this
// engine's own pages and generate (a vLLM engine given no
// kv_transfer_params).
func (s *Sim) local(ctx context.Context, q *genRequest) (*answer, func(), *httpError) {
	ans := &answer{}
	var all [][]int
	release := func() {
		for _, p := range all {
			s.pool.release(p)
		}
	}
	for _, prompt := range q.prompts {
		seeds := promptSeeds(prompt)
		t, e := s.waitTurn(ctx, prompt)
		if e != nil {
			release()
			return nil, nil, e
		}
		pages, ok := s.pool.alloc(s.pool.pagesFor(len(prompt)))
		if !ok {
			t.done()
			release()
			return nil, nil, errPoolFull
		}
		all = append(all, pages)
		if e := s.compute(ctx, t, prompt, seeds, pages); e != nil {
			release()
			return nil, nil, e
		}
		ans.seqs = append(ans.seqs, q.seqFor(prompt, seeds, q.maxTokens))
	}
	return ans, release, nil
}

func (s *Sim) handleModels(w http.ResponseWriter, r *http.Request) {
	created := s.cfg.Now().Unix()
	m := map[string]any{
		"id": s.cfg.Model, "object": "model", "created": created, "owned_by": "pdplane-sim",
		"root": s.cfg.Model, "max_model_len": s.maxModelLen(),
	}
	if s.cfg.Engine == registry.EngineVLLM {
		// vLLM's ModelCard (vllm/entrypoints/openai/protocol.py), with its
		// default ModelPermission.
		m["owned_by"], m["parent"] = "vllm", nil
		m["permission"] = []any{map[string]any{
			"id": "modelperm-" + s.cfg.Name, "object": "model_permission", "created": created,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
			"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false,
		}}
	}
	writeJSON(w, map[string]any{"object": "list", "data": []any{m}})
}

// maxModelLen is the longest prompt the engine takes: its KV pool.
func (s *Sim) maxModelLen() int { return s.cfg.Pages * s.cfg.PageSize }

func (s *Sim) handleModelInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{
		"model_path": s.cfg.Model, "tokenizer_path": s.cfg.Model, "is_generation": true,
		"preferred_sampling_params": nil, "weight_version": "default",
	})
}

// handleVersion is vLLM's GET /version (entrypoints/openai/api_server.py
// show_version): {"version": ...}.
func (s *Sim) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{"version": "pdplane-sim"})
}

func (s *Sim) handleServerInfo(w http.ResponseWriter, r *http.Request) {
	l := s.Load()
	mode, page, one := string(s.cfg.Role), s.cfg.PageSize, 1
	type internalState struct {
		Running int     `json:"num_running_reqs"`
		Queued  int     `json:"num_queue_reqs"`
		KVUsage float64 `json:"kv_usage"`
	}
	writeJSON(w, struct {
		pdproto.SGLangServerInfo
		Version         string          `json:"version"`
		TransferBackend string          `json:"disaggregation_transfer_backend"`
		SimTransfer     string          `json:"pdplane_transfer_backend"`
		MaxTokens       int             `json:"max_total_num_tokens"`
		AgentName       string          `json:"nixl_agent_name"`
		InternalStates  []internalState `json:"internal_states"`
	}{
		SGLangServerInfo: pdproto.SGLangServerInfo{ModelPath: s.cfg.Model, ServedModelName: s.cfg.Model, DisaggregationMode: &mode,
			DisaggregationBootstrapPort: s.bootstrapPort, PageSize: &page, KVCacheDType: s.cfg.DType, TPSize: &one, DPSize: 1, PPSize: 1},
		Version: "pdplane-sim", TransferBackend: "nixl", SimTransfer: s.cfg.Transfer,
		MaxTokens: s.cfg.Pages * s.cfg.PageSize, AgentName: s.AgentName(),
		InternalStates: []internalState{{Running: l.Running, Queued: l.Queued, KVUsage: l.KVUsage}},
	})
}

// runAll runs f for 0..n-1 concurrently (inline for one) and returns the
// first error by index.
func runAll(n int, f func(i int) *httpError) *httpError {
	if n == 1 {
		return f(0)
	}
	errs := make([]*httpError, n)
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			errs[i] = f(i)
		}()
	}
	for range n {
		<-done
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// needBootstrap refuses an SGLang PD request without the bootstrap triple.
func needBootstrap(q *genRequest) *httpError {
	if len(q.bootstrap) == 0 {
		return badRequestErr(badf("bootstrap_room", "an SGLang engine in PD mode needs bootstrap_host, bootstrap_port and bootstrap_room"))
	}
	return nil
}

// tokenPause is the pause before token k of ans.
//
// An SGLang decode does not compute its first output token: the prefill
// does, and writes it into the metadata buffers that travel with the KV
// (python/sglang/srt/disaggregation/prefill.py, the metadata set for each
// request its forward finished). On KVPoll.Success the decode reads it back
// (decode.py, DecodeTransferQueue.pop_transferred:
// output_id_buffer[idx][0] into req.transferred_output_id) and its
// prebuilt batch (ScheduleBatch.prepare_for_prebuilt, process_prebuilt)
// hands it on without a forward pass: the first token leaves as soon as the
// KV is in, and the decode's per-token time applies from the second on. A
// vLLM decode computes its first token itself: once the remote KV is in,
// the scheduler takes one token off the computed count
// (vllm/v1/core/sched/scheduler.py, _update_waiting_for_remote_kv:
// "if num_computed_tokens == request.num_tokens: num_computed_tokens -= 1")
// and runs a forward over the last prompt token, so it pauses before every
// token. A prefill answering more than one token (an engine used alone)
// pauses before each too.
func (s *Sim) tokenPause(ans *answer) func(k int) time.Duration {
	switch {
	case s.cfg.Role == registry.RoleDecode && s.cfg.Engine == registry.EngineSGLang:
		return func(k int) time.Duration {
			if k == 0 {
				return 0
			}
			return s.decodeTime()
		}
	case s.cfg.Role == registry.RoleDecode || ans.seqs[0].n > 1:
		return func(int) time.Duration { return s.decodeTime() }
	}
	return func(int) time.Duration { return 0 }
}

// answerTime is the time n tokens take under pause: the first token's pause
// and n-1 times the next ones'.
func answerTime(pause func(k int) time.Duration, n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return pause(0) + time.Duration(n-1)*pause(1)
}
