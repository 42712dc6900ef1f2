package router

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// Log field names.
const (
	logRequestID      = "request_id"
	logRoute          = "route"
	logModel          = "model"
	logPrefill        = "prefill"
	logDecode         = "decode"
	logGeneration     = "generation"
	logDetail         = "detail"
	logStatus         = "status"
	logOutcome        = "outcome"
	logAttempts       = "attempts"
	logDuration       = "duration_ms" // durations are logged as milliseconds (float), the unit in the key
	logLeg            = "leg"
	logUpstreamStatus = "upstream_status"
	logFailure        = "failure"
)

// Sizes of the buffers the router holds per request.
const (
	relayBufSize   = 2 << 10  // per open stream, while relaying; SSE events are smaller
	errorBodyLimit = 64 << 10 // what is kept of an engine's error answer
	prefillKeep    = 64 << 10 // what is kept of a prefill's answer without logprobs
	errTextLimit   = 4 << 10  // what of an error answer goes to the registry
)

// leg is one half of a PD request.
type leg uint8

const (
	legPrefill leg = iota
	legDecode
)

func (l leg) String() string { return l.proto().String() }

func (l leg) proto() pdproto.Leg {
	if l == legPrefill {
		return pdproto.LegPrefill
	}
	return pdproto.LegDecode
}

// failKind classifies how an attempt failed; it decides retries, breakers
// and the client's status.
type failKind uint8

const (
	failTransport   failKind = iota + 1 // refused, reset, EOF: 502, breaker failure
	failTimeout                         // 504, breaker failure
	failStatus                          // the engine answered 5xx (or an error event): 502, breaker failure
	failProtocol                        // the engine's answer was unusable: 502, breaker failure
	failOverload                        // 429, or 503 with Retry-After: another pair, no breaker failure
	failUpstream4xx                     // the engine refused the request: passed on, no retry
	failMemKind                         // the prefill could not send KV to the decode: pair breaker open, report, retry
	failPair                            // the pair could not move KV (or the decode never answered after a good prefill): pair breaker, retry
	failClientGone                      // the client left: 499 in logs
	failUnsupported                     // the route does not exist in the engine's protocol
)

func (k failKind) String() string {
	switch k {
	case failTransport:
		return "transport"
	case failTimeout:
		return "timeout"
	case failStatus:
		return "status"
	case failProtocol:
		return "protocol"
	case failOverload:
		return "overload"
	case failUpstream4xx:
		return "upstream_4xx"
	case failMemKind:
		return causeMissingMemKind
	case failPair:
		return "pair"
	case failClientGone:
		return "client_gone"
	case failUnsupported:
		return "unsupported"
	}
	return "unknown"
}

// class is the kind as pdproto classifies engine failures: a failure the
// router saw itself (a refused connection, a timeout, an unusable answer)
// is the engine's, as an engine's 5xx is.
func (k failKind) class() pdproto.Class {
	switch k {
	case failTransport, failTimeout, failStatus, failProtocol:
		return pdproto.ClassEngine
	case failOverload:
		return pdproto.ClassOverload
	case failUpstream4xx:
		return pdproto.ClassRefused
	case failMemKind:
		return pdproto.ClassMissingMemKind
	case failPair:
		return pdproto.ClassTransfer
	}
	return pdproto.ClassNone
}

// failure is why one attempt did not deliver.
type failure struct {
	kind   failKind
	leg    leg
	status int         // the engine's status, when it answered
	header http.Header // the engine's headers, when it answered
	body   []byte      // the engine's answer, bounded, when it answered
	err    error
}

// blame is whom the failure counts against (pdproto's one rule): a retry
// avoids that peer, or only that pair.
func (f *failure) blame() pdproto.Blame { return f.kind.class().Blame() }

func (f *failure) retryable() bool {
	switch f.kind {
	case failUpstream4xx, failClientGone, failUnsupported:
		return false
	}
	return true
}

// Causes of cancelling an attempt's context, to tell which leg failed first.
var (
	errPrefillLegFailed = errors.New("prefill leg failed")
	errDecodeLegFailed  = errors.New("decode leg failed")
	errAttemptOver      = errors.New("attempt over")
	// errDecodeFirstByte: the decode sent nothing within
	// DecodeFirstByteTimeout after its prefill answered in full.
	errDecodeFirstByte = errors.New("the decode sent nothing in time after its prefill succeeded")
)

// dispatch is one client request on its way through the router.
type dispatch struct {
	rt    *Router
	w     http.ResponseWriter
	r     *http.Request
	rc    http.ResponseController
	ctx   context.Context // the client's: ends when it leaves
	route route
	q     *request
	// series are the model's series on the route, once the model is
	// resolved (at dispatch).
	series *modelSeries
	rid    string
	key    uint64
	prompt *promptBlocks // the precise policy's view of the prompt; nil under another
	// queued is what this attempt's prompt adds to its prefill's queue
	// (precise), until its prefill leg ends (prefillEnded).
	queued atomic.Pointer[queuedPrompt]
	ex     exclusions

	start      time.Time
	dispatched time.Time

	// Per attempt: the attempt's context (its cause tells which leg or
	// deadline ended it; it keeps the decode's first-byte deadline).
	actx *attemptCtx

	// Tracing, all nil when it is off: the request's span and the context
	// that carries it, and the span of the attempt under way.
	span        trace.Span
	tctx        context.Context
	attemptSpan trace.Span

	committed bool // headers (and maybe bytes) went to the client
	ttftSeen  bool
	usage     usageTap            // token counts read from the answer as it is relayed
	guard     pdproto.StreamGuard // a stream's framing, checked as it is relayed
	sent      int64               // bytes of the answer written to the client
	abort     bool                // the response must be cut, not ended
	attempts  int
	prefill   string
	decode    string
	// The pair's generations, and the attempts before it that failed
	// ("kind:prefill>decode"): the route receipt.
	pGen, dGen int64
	failed     []string
	// stats are the last attempt's pair's (pair_stats.go); kvBlocks the KV
	// blocks its vLLM prefill handed the decode (-1: not known).
	stats    *pairStats
	kvBlocks int
	status   int
	outcome  string
	lastFail *failure

	// A stream runs on a goroutine of its own (serveOnOwnGoroutine), which
	// tells the handler through hop when it may return; tk is the client's
	// connection once the router took it over from net/http (takeover.go),
	// and detachable's pair replaces net/http's context meanwhile.
	hop             chan hop
	tk              *httpwire.Stream
	noTakeover      bool // tried, and the connection could not be hijacked
	clientCancel    func(error)
	stopClientWatch func() bool
}

// serveGeneration returns the handler of one generation route.
func (rt *Router) serveGeneration(rte route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d := &dispatch{rt: rt, w: w, r: r, ctx: r.Context(), route: rte, start: rt.cfg.Now()}
		d.serve()
	}
}

// serve answers the request. A stream that HTTP/1.1 carries runs on a
// goroutine of its own, so that it can leave net/http's connection if it
// turns out to be slow (takeover.go).
func (d *dispatch) serve() {
	rt := d.rt
	d.rid = requestID(d.w, d.r)
	if rt.tracer != nil {
		d.startSpan()
	}
	if !rt.admit.acquire() {
		d.w.Header().Set("Retry-After", "1")
		d.reject(serverError(http.StatusServiceUnavailable, "the router is at its limit of "+strconv.Itoa(rt.cfg.MaxInflight)+
			" requests in flight (--max-inflight); retry shortly", codeRouterBusy), outcomeRouterBusy)
		d.finish()
		return
	}
	rt.m.inflight.Inc()
	// Ended here, even when the request panics, unless the dispatch went
	// to its own goroutine, which ends it then.
	hopped := false
	defer func() {
		if hopped {
			return
		}
		if p := recover(); p != nil {
			// Counted as what it is, then passed on to net/http, which
			// logs it and cuts the connection.
			if p != http.ErrAbortHandler {
				d.failedInternally()
			}
			d.end()
			panic(p)
		}
		d.end()
	}()
	v, mv := d.prepare()
	switch {
	case mv == nil:
	case d.q.stream && d.r.ProtoMajor == 1 && d.r.ProtoMinor >= 1 && !rt.cfg.DisableTakeover && rt.Watcher() != nil:
		hopped = true
		d.detachable()
		d.serveOnOwnGoroutine(v, mv)
		return
	default:
		d.run(v, mv)
	}
	if d.abort {
		panic(http.ErrAbortHandler) // after end: the deferred call runs first
	}
}

// prepare reads and checks the request and finds its model's routes; a
// nil modelView means it was refused (answered).
func (d *dispatch) prepare() (*view, *modelView) {
	rt := d.rt
	body, aerr := rt.readBody(d.r)
	if aerr != nil {
		d.reject(aerr, outcomeBadRequest)
		return nil, nil
	}
	q, aerr := parseRequest(d.route, body, rt.cfg.CacheAwarePrefixBytes)
	if aerr != nil {
		d.reject(aerr, outcomeBadRequest)
		return nil, nil
	}
	d.q = q
	d.usage.stream = q.stream
	v := rt.currentView()
	mv, aerr := d.resolveModel(v)
	if aerr != nil {
		outcome := outcomeBadRequest
		if aerr.Status == http.StatusServiceUnavailable {
			outcome = outcomeNoRoute
		}
		d.reject(aerr, outcome)
		return nil, nil
	}
	d.key = xxhash.Sum64(q.prefix)
	if len(mv.tokenizers) > 0 {
		d.prompt = rt.promptBlocks(d.ctx, q, mv)
	}
	d.rc = *http.NewResponseController(d.w)
	d.series = &mv.series[d.route]
	d.dispatched = rt.cfg.Now()
	return v, mv
}

// end releases the request's admission and counts and logs it.
func (d *dispatch) end() {
	d.rt.m.inflight.Dec()
	d.rt.admit.release()
	d.finish()
}

// resolveModel finds the model's routes, or says why there are none: an
// unknown model is the client's error (404); a known one without a ready,
// compatible pair is 503 naming the missing role.
func (d *dispatch) resolveModel(v *view) (*modelView, *apiError) {
	q := d.q
	if !q.modelGiven {
		switch models := v.snap.Models(); len(models) {
		case 1:
			q.model = models[0]
		case 0:
			return nil, serverError(http.StatusServiceUnavailable, "no model is being served: no ready peers", codeNoRoute)
		default:
			return nil, badRequest("'model' is required: this router serves "+strconv.Itoa(len(models))+" models", "model", codeModelRequired)
		}
	}
	mv := v.models[q.model]
	if mv == nil {
		for _, p := range v.snap.Peers() {
			if p.Model == q.model {
				return nil, serverError(http.StatusServiceUnavailable, "model "+strconv.Quote(q.model)+": no ready prefill and no ready decode", codeNoRoute)
			}
		}
		return nil, &apiError{Status: http.StatusNotFound, Message: "the model " + strconv.Quote(q.model) + " does not exist",
			Type: "invalid_request_error", Param: "model", Code: codeModelNotFound}
	}
	switch {
	case len(mv.prefills) == 0:
		return nil, serverError(http.StatusServiceUnavailable, "model "+strconv.Quote(q.model)+": no ready prefill", codeNoRoute)
	case len(mv.routes.Decodes) == 0:
		return nil, serverError(http.StatusServiceUnavailable, "model "+strconv.Quote(q.model)+": no ready decode", codeNoRoute)
	case !mv.pairable:
		return nil, serverError(http.StatusServiceUnavailable, "model "+strconv.Quote(q.model)+": no ready decode is compatible with a ready prefill (see /api/v1/pairs)", codeNoRoute)
	}
	return mv, nil
}

// run tries pairs until one delivers, the failure is the client's, or the
// attempts are spent. Once a byte has reached the client there is no retry.
func (d *dispatch) run(v *view, mv *modelView) {
	rt := d.rt
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			v = rt.currentView()
			if mv = v.models[d.q.model]; mv == nil {
				d.respondFailure(d.lastFail)
				return
			}
		}
		pr, ok := rt.pickPair(v, mv, d.key, d.prompt, &d.ex)
		if !ok {
			if d.lastFail != nil {
				d.respondFailure(d.lastFail)
				return
			}
			d.reject(serverError(http.StatusServiceUnavailable, "model "+strconv.Quote(d.q.model)+
				": no healthy pair: every compatible pair is failing or has its circuit breaker open", codeNoRoute), outcomeNoRoute)
			return
		}
		if d.lastFail != nil {
			// Counted here, when another pair is actually tried: a failure
			// with no pair left, or a client gone during the backoff, is
			// not a retry.
			rt.m.retries.WithLabelValues(d.lastFail.kind.String()).Inc()
		}
		d.attempts = attempt
		if attempt == 1 && d.prompt != nil && d.prompt.scored {
			rt.m.preciseTokens.prompt.Add(float64(len(d.prompt.tokens)))
			rt.m.preciseTokens.cached.Add(float64(d.prompt.cached))
		}
		d.prefill, d.decode = pr.p.peer.Name, pr.d.peer.Name
		d.pGen, d.dGen = pr.p.peer.Generation, pr.d.peer.Generation
		d.stats, d.kvBlocks = rt.pairStats.of(rt.m, &pr), -1
		d.startAttempt(attempt, &pr)
		f := d.attemptSettled(&pr)
		if f == nil {
			d.stats.ok.Inc()
			d.outcome = outcomeOK
			return
		}
		if f.kind != failClientGone {
			d.stats.failed.Inc()
		}
		d.lastFail = f
		d.failed = append(d.failed, f.kind.String()+":"+d.prefill+">"+d.decode)
		switch {
		case f.kind == failMemKind:
			rt.onMemKindFailure(&pr, errText(f.body), d.rid, d.spanContext())
		case f.kind == failPair && f.status >= 500 && pr.d.ep.protocol == registry.EngineVLLM:
			rt.onKVLoadFailure(&pr, errText(f.body), d.rid, d.spanContext())
		}
		if d.committed {
			d.brokenStream(f)
			return
		}
		d.logFailure(&pr, f, attempt)
		if !f.retryable() || attempt >= rt.cfg.MaxAttempts {
			d.respondFailure(f)
			return
		}
		switch f.blame() {
		case pdproto.BlamePair:
			d.ex.addPair(pr.p.peer.ID, pr.d.peer.ID)
		case pdproto.BlamePeer:
			if f.leg == legPrefill {
				d.ex.add(pr.p.peer.ID)
			} else {
				d.ex.add(pr.d.peer.ID)
			}
		}
		if !d.backoff(attempt) {
			d.respondFailure(&failure{kind: failClientGone, leg: f.leg, err: d.ctx.Err()})
			return
		}
	}
}

// backoff pauses before the next attempt: base × 2^(attempt-1), capped,
// with ±50 % jitter. It returns false when the client left meanwhile.
func (d *dispatch) backoff(attempt int) bool {
	cfg := &d.rt.cfg
	if cfg.RetryBackoff <= 0 {
		return d.ctx.Err() == nil
	}
	p := cfg.RetryBackoff << min(attempt-1, 16)
	if p > cfg.RetryBackoffMax || p <= 0 {
		p = cfg.RetryBackoffMax
	}
	p = p/2 + time.Duration(rand.Int64N(int64(p)+1))
	t := time.NewTimer(p)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-d.ctx.Done():
		return false
	}
}

// attemptSettled runs one attempt and feeds its outcome to the breakers.
// An attempt that panics (a fault of the router's own, or a leg's panic
// raised again) judges no engine, but gives back the probes it holds: a
// half-open breaker whose probe never came back would keep its peer out of
// every pick for good.
func (d *dispatch) attemptSettled(pr *pair) *failure {
	ran := false
	defer func() {
		if !ran {
			pr.release()
		}
	}()
	f := d.attempt(pr)
	d.endAttempt(f)
	ran = true // settle hands the probes on: never twice
	d.rt.settle(pr, f)
	return f
}

// attempt runs one pair.
func (d *dispatch) attempt(pr *pair) *failure {
	proto := pr.p.ep.protocol
	if d.route == routeGenerate && proto == registry.EngineVLLM {
		return &failure{kind: failUnsupported, leg: legPrefill}
	}
	pr.p.state.inflight.Add(1)
	pr.d.state.inflight.Add(1)
	defer pr.p.state.inflight.Add(-1)
	defer pr.d.state.inflight.Add(-1)
	if q := d.prompt; q != nil && q.scored {
		d.queued.Store(q.enqueue(pr.p.state))
		defer d.prefillEnded()
	}
	if proto == registry.EngineVLLM {
		return d.runVLLM(pr)
	}
	return d.runSGLang(pr)
}

// prefillEnded takes the attempt's prompt off its prefill's queue, once.
func (d *dispatch) prefillEnded() {
	if qp := d.queued.Swap(nil); qp != nil {
		qp.dequeue()
	}
}

// settle feeds an attempt's outcome to the breakers it touched.
func (rt *Router) settle(pr *pair, f *failure) {
	now := rt.cfg.Now()
	if f == nil || f.kind == failUpstream4xx {
		pr.p.state.breaker.success(pr.pProbe)
		pr.d.state.breaker.success(pr.dProbe)
		if pr.pairBrk != nil {
			pr.pairBrk.success(pr.pairProbe)
		} else if b := rt.pairs.get(pr.p.peer.ID, pr.d.peer.ID); b != nil {
			b.success(false)
		}
		if f == nil {
			rt.onTrialSuccess(pr)
		}
		return
	}
	switch {
	case f.kind == failOverload || f.kind == failClientGone || f.kind == failUnsupported:
		pr.release()
		return
	case f.blame() == pdproto.BlamePair:
		// The pair cannot transfer; neither peer is down.
		pr.p.state.breaker.release(pr.pProbe)
		pr.d.state.breaker.release(pr.dProbe)
	default:
		culprit, culpritProbe, other, otherProbe := pr.p, pr.pProbe, pr.d, pr.dProbe
		if f.leg == legDecode {
			culprit, culpritProbe, other, otherProbe = pr.d, pr.dProbe, pr.p, pr.pProbe
		}
		if f.kind == failTransport && f.status == 0 && httpwire.Refused(f.err) {
			// Nothing listens there, or it reset the connection before
			// any answer: no other request should try it before the
			// cool-down, nor wait for the threshold's worth of failures.
			if culprit.state.breaker.forceOpen(now) {
				rt.log.Warn().Str(logLeg, f.leg.String()).Str("peer", culprit.peer.Name).Err(f.err).
					Msg("peer circuit breaker opened: the engine refused the connection")
			}
		} else if culprit.state.breaker.failure(culpritProbe, rt.cfg.BreakerFailures, now) {
			rt.log.Warn().Str(logLeg, f.leg.String()).Str("peer", culprit.peer.Name).Str(logFailure, f.kind.String()).
				Msg("peer circuit breaker opened")
		}
		other.state.breaker.release(otherProbe)
	}
	b := pr.pairBrk
	if b == nil {
		b = rt.pairs.getOrCreate(pr.p.peer.ID, pr.d.peer.ID)
	}
	if f.kind == failMemKind {
		// SGLang's broken registration fails every transfer of the pair
		// until the decode re-registers (which resets the breaker).
		b.forceOpen(now) // ends any probe it held
		return
	}
	b.failure(pr.pairProbe, rt.cfg.BreakerFailures, now)
}

// commit sends the decode's status and headers to the client: from here on
// the request cannot move to another pair.
func (d *dispatch) commit(resp *http.Response, contentLength int) {
	h := newFields(d.w.Header(), 4)
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		h.set("Content-Type", ct)
	}
	if d.q.stream {
		h.set("Cache-Control", "no-cache")
		h.set("X-Accel-Buffering", "no")
	}
	if contentLength >= 0 {
		h.set("Content-Length", strconv.Itoa(contentLength))
	}
	if d.rt.cfg.RouteReceipt {
		h.set(RouteReceiptHeader, d.receipt())
	}
	d.status = resp.StatusCode
	d.w.WriteHeader(resp.StatusCode)
	d.committed = true
	// No retry can follow: let go of what only a retry would need, so that
	// a long stream does not pin the client's body, nor the engine's
	// headers and the request it answered (which holds the upstream body).
	d.q.body, d.q.members, d.q.prefix = nil, nil, nil
	// Status is a piece of the head's string (parseHead), which a long
	// stream must not keep (its Content-Type, another, goes with net/http's
	// response, which a taken-over stream lets go of).
	resp.Header, resp.Request, resp.Status = nil, nil, ""
}

// RouteReceiptHeader is the answer's field that says which route served
// it, with Config.RouteReceipt (serve --route-receipt): the pair that
// answered with both generations, the attempts, and each failed attempt's
// kind and pair, e.g. "prefill=p0@2 decode=d0@1 attempts=2
// failed=missing_mem_kind:p1>d0". Under the precise policy it also says
// how many of the prompt's tokens the router counted on the prefill holding
// when the prompt computes (precise.go held): "held_tokens=384/400".
const RouteReceiptHeader = "X-Pdplane-Route"

// receipt is the route receipt of the answer being committed.
func (d *dispatch) receipt() string {
	b := make([]byte, 0, 64+24*len(d.failed))
	b = append(b, "prefill="...)
	b = append(b, d.prefill...)
	b = strconv.AppendInt(append(b, '@'), d.pGen, 10)
	b = append(append(b, " decode="...), d.decode...)
	b = strconv.AppendInt(append(b, '@'), d.dGen, 10)
	b = strconv.AppendInt(append(b, " attempts="...), int64(d.attempts), 10)
	if d.kvBlocks >= 0 {
		b = strconv.AppendInt(append(b, " kv_blocks="...), int64(d.kvBlocks), 10)
	}
	if p := d.prompt; p != nil && p.scored {
		b = strconv.AppendInt(append(b, " held_tokens="...), int64(p.cached), 10)
		b = strconv.AppendInt(append(b, '/'), int64(len(p.tokens)), 10)
	}
	for i, f := range d.failed {
		if i == 0 {
			b = append(b, " failed="...)
		} else {
			b = append(b, ',')
		}
		b = append(b, f...)
	}
	return string(b)
}

// fields sets header fields new to a header with their values in one
// array: a header of a few fields costs one map and one array rather than
// an array a field.
type fields struct {
	h    http.Header
	vals []string
}

func newFields(h http.Header, n int) fields { return fields{h: h, vals: make([]string, 0, n)} }

func (f *fields) set(k, v string) {
	f.vals = append(f.vals, v)
	f.h[k] = f.vals[len(f.vals)-1 : len(f.vals) : len(f.vals)]
}

// write sends bytes to the client, flushing when streaming; the first write
// stamps the TTFT.
func (d *dispatch) write(b []byte) error { return d.send(b, true) }

// send is write, flushing a stream only when flush is set: the relay leaves
// bytes in the response's buffer while more of the answer has already
// arrived, and they leave with it.
func (d *dispatch) send(b []byte, flush bool) error {
	if len(b) == 0 {
		return nil
	}
	if d.q.stream {
		if n, err := d.guard.Check(b); err != nil {
			// What came before the line that is not an event, then the
			// end of any event it was in: the error event follows.
			_ = d.out(append(b[:n:n], '\n'), true)
			return &badFrameError{err}
		}
	}
	if err := d.out(b, d.q.stream && flush); err != nil {
		return err
	}
	d.usage.feed(b)
	d.sent += int64(len(b))
	if !d.ttftSeen {
		d.ttftSeen = true
		d.series.ttftOf(d.rt.m, d.route, d.q.model).Observe(d.rt.cfg.Now().Sub(d.dispatched).Seconds())
	}
	return nil
}

// badFrameError is a stream's line that is not a server-sent event's
// (pdproto.StreamGuard), found as it was about to be relayed.
type badFrameError struct{ err error }

func (e *badFrameError) Error() string {
	return "the decode's stream broke its framing: " + e.err.Error()
}

// sendFailure is the failure of a send that returned err: the decode's,
// when its stream broke its framing; else the client's, which left.
func sendFailure(err error) *failure {
	if bf, ok := err.(*badFrameError); ok {
		return &failure{kind: failProtocol, leg: legDecode, err: bf}
	}
	return &failure{kind: failClientGone, leg: legDecode, err: err}
}

// relayBody is an answer's body that can say whether bytes are waiting and
// wait for them without a buffer: httpwire.Transport's.
type relayBody interface {
	Ready() bool
	// AtEnd reports whether the next Read returns io.EOF without reading
	// the connection: the answer's end has arrived.
	AtEnd() bool
	Await()
	AwaitFor(d time.Duration) bool
}

// mustFlush reports whether bytes of a stream just sent to the client must
// be flushed now, after a read of its body (rb; nil when it cannot tell
// what is buffered) that returned err: only when the client would otherwise
// wait for them. Not when more of the answer is ready (it leaves with
// them), nor when the answer has ended or its end has arrived: the
// handler's return then flushes them with net/http's terminator, one write
// where a flush would make two. A unary answer is never flushed early.
func (d *dispatch) mustFlush(rb relayBody, err error) bool {
	if !d.q.stream || err != nil {
		return false
	}
	return rb == nil || !rb.Ready() && !rb.AtEnd()
}

// slowStreamWait is how long a relay must have waited for the engine's
// last bytes for it to wait for the next ones without a buffer. A decode
// that paused that long is slow (held, queued, or a client reading slowly
// upstream of it), and its stream may stay open for long; one generating at
// speed stays on the plain path, which spends no system call on the wait.
const slowStreamWait = 100 * time.Millisecond

// relay copies the rest of the decode's answer to the client as it arrives.
// A stream is flushed whenever the engine has sent nothing more yet.
//
// A slow stream holds no buffer between reads: it waits for the engine's
// next bytes without one (relayBody.await) and takes a relay buffer from the
// pool only to copy what has arrived, so that a stream held open on a slow
// decode does not pin 4 KiB of buffers (this one and the connection's) for
// its whole life.
func (d *dispatch) relay(body io.Reader) *failure {
	rb, _ := body.(relayBody)
	slow := false
	// A stream that may leave net/http (takeover.go) is watched for its
	// first silence: one that lasts slowStreamWait makes it slow at once,
	// not only once the gap has ended (on a queued or idle decode, maybe
	// minutes later). It costs a stream one more system call.
	watchFirst := rb != nil && d.mayTakeOver()
	for {
		// Only a read that may wait is timed: one of bytes already
		// buffered returns at once (and the clock is read twice a chunk
		// otherwise, a stream's tokens being mostly buffered ones).
		timed := rb == nil || !rb.Ready()
		var start time.Time
		if timed {
			start = d.rt.cfg.Now()
		}
		if watchFirst {
			watchFirst = false
			slow = !rb.AwaitFor(slowStreamWait)
		}
		// A slow stream is taken over, and waits without a buffer, when
		// it is about to wait again: not while more of it has arrived
		// (it stays slow until then), nor once its end has (taking it
		// over would only end it, in more writes).
		inHand := slow && (rb.Ready() || rb.AtEnd())
		if slow && !inHand {
			if d.mayTakeOver() {
				d.noTakeover = !d.takeover()
			}
			rb.Await()
		}
		bp := d.rt.getRelayBuf()
		n, err := body.Read(*bp)
		slow = rb != nil && (inHand || timed && d.rt.cfg.Now().Sub(start) > slowStreamWait)
		var werr error
		if n > 0 {
			werr = d.send((*bp)[:n], d.mustFlush(rb, err))
		}
		d.rt.putRelayBuf(bp)
		switch {
		case werr != nil:
			return sendFailure(werr)
		case err == nil:
		case errors.Is(err, io.EOF):
			return nil
		default:
			return d.transportFailure(legDecode, err)
		}
	}
}

// readFirst reads until the decode sends something or ends.
func readFirst(body io.Reader, buf []byte) (int, error) {
	for {
		n, err := body.Read(buf)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// brokenStream ends a response whose first byte already went out: an SSE
// stream gets an error event, anything else is cut so that the client cannot
// take it for complete.
func (d *dispatch) brokenStream(f *failure) {
	switch {
	case f.kind == failClientGone:
		d.outcome, d.status = outcomeClientGone, 499
	case d.q.stream:
		d.outcome = outcomeStreamError
		e := serverError(http.StatusBadGateway, "the decode engine failed mid-stream; the answer is incomplete", codeStreamBroken)
		_ = d.out(e.sseEvent(), true)
	default:
		d.outcome = outcomeStreamError
		d.abort = true
	}
}

// respondFailure answers the client after the last attempt failed before its
// first byte.
func (d *dispatch) respondFailure(f *failure) {
	if f == nil {
		d.reject(serverError(http.StatusServiceUnavailable, "model "+strconv.Quote(d.q.model)+": no longer served", codeNoRoute), outcomeNoRoute)
		return
	}
	model := strconv.Quote(d.q.model)
	switch f.kind {
	case failClientGone:
		d.outcome, d.status = outcomeClientGone, 499
	case failUpstream4xx:
		// The engine's own answer, which names what the client must fix.
		h := d.w.Header()
		if ct := f.header.Get("Content-Type"); ct != "" {
			h.Set("Content-Type", ct)
		}
		d.status, d.outcome = f.status, outcomeUpstream4xx
		d.w.WriteHeader(f.status)
		_, _ = d.w.Write(f.body)
	case failOverload:
		if ra := f.header.Get("Retry-After"); ra != "" {
			d.w.Header().Set("Retry-After", ra)
		}
		e := serverError(f.status, "model "+model+": every engine tried is overloaded; retry later", codeOverloaded)
		if f.status == http.StatusTooManyRequests {
			e.Type = "rate_limit_error"
		}
		d.reject(e, outcomeOverloaded)
	case failTimeout:
		d.reject(serverError(http.StatusGatewayTimeout, "model "+model+": the "+f.leg.String()+" engine timed out", codeUpstreamTimeout), outcomeTimeout)
	case failUnsupported:
		d.reject(&apiError{Status: http.StatusBadRequest, Message: "model " + model + " is served by vLLM engines, which have no native /generate; use /v1/completions",
			Type: "invalid_request_error", Code: codeUnsupported}, outcomeBadRequest)
	case failMemKind:
		d.reject(serverError(http.StatusBadGateway, "model "+model+": the KV cache transfer from prefill to decode failed on every pair tried", codeUpstreamError), outcomeUpstreamErr)
	case failPair:
		if errors.Is(f.err, errDecodeFirstByte) {
			d.reject(serverError(http.StatusGatewayTimeout, "model "+model+": the decode engine sent nothing in time after its prefill", codeUpstreamTimeout), outcomeTimeout)
			return
		}
		d.reject(serverError(http.StatusBadGateway, "model "+model+": the KV cache transfer from prefill to decode failed on every pair tried", codeUpstreamError), outcomeUpstreamErr)
	default:
		msg := "model " + model + ": the " + f.leg.String() + " engine failed"
		if f.status != 0 {
			msg += " (HTTP " + strconv.Itoa(f.status) + ")"
		} else {
			msg += " (no answer)"
		}
		d.reject(serverError(http.StatusBadGateway, msg, codeUpstreamError), outcomeUpstreamErr)
	}
}

// reject answers with the router's own error.
func (d *dispatch) reject(e *apiError, outcome string) {
	d.status, d.outcome = e.Status, outcome
	e.write(d.w)
}

// logFailure records an attempt that will be retried or answered.
func (d *dispatch) logFailure(pr *pair, f *failure, attempt int) {
	if f.kind == failClientGone {
		return
	}
	ev := d.rt.log.Info().Str(logRequestID, d.rid).Str(logRoute, d.route.label()).Str(logModel, d.q.model).
		Str(logPrefill, pr.p.peer.Name).Str(logDecode, pr.d.peer.Name).Int(logAttempts, attempt).
		Str(logLeg, f.leg.String()).Str(logFailure, f.kind.String())
	if id := d.traceID(); id != "" {
		ev = ev.Str(logTraceID, id)
	}
	if f.status != 0 {
		ev = ev.Int(logUpstreamStatus, f.status)
	}
	if f.err != nil {
		ev = ev.Err(f.err)
	}
	ev.Msg("attempt failed")
}

// failedInternally records a request the router itself failed (a panic):
// its answer is cut, or none is sent.
func (d *dispatch) failedInternally() {
	d.outcome, d.abort = outcomeInternal, true
	if !d.committed {
		d.status = http.StatusInternalServerError
	}
}

// finish counts and logs the request once it is answered.
func (d *dispatch) finish() {
	rt := d.rt
	if d.outcome == "" {
		d.outcome = outcomeOK
	}
	if d.status == 0 {
		d.status = http.StatusOK
	}
	if d.span != nil {
		d.endSpan()
	}
	elapsed := rt.cfg.Now().Sub(d.start)
	rt.m.countRequest(d.route, d.outcome)
	if !d.dispatched.IsZero() {
		// The model is one the snapshot serves: a bounded label.
		model := d.q.model
		d.series.durationOf(rt.m, d.route, model).Observe(elapsed.Seconds())
		if d.outcome == outcomeOK {
			if u := &d.usage; u.seenP || u.seenC {
				d.series.promptOf(rt.m, d.route, model).Add(float64(u.prompt))
				d.series.completionOf(rt.m, d.route, model).Add(float64(u.completion))
			}
		}
	}
	if d.outcome == outcomeOK && d.attempts > 0 {
		d.pairServed()
	}
	var ev *zerolog.Event
	sampled := false
	switch d.outcome {
	case outcomeOK:
		ev, sampled = rt.servedEvent()
	case outcomeBadRequest, outcomeClientGone, outcomeUnauthorized, outcomeUpstream4xx, outcomeRouterBusy:
		ev = rt.log.Info()
	default:
		ev = rt.log.Warn()
	}
	if ev.Enabled() {
		model := ""
		if d.q != nil {
			model = d.q.model
		}
		ev.Str(logRequestID, d.rid).Str(logRoute, d.route.label()).Str(logModel, model).
			Int(logStatus, d.status).Str(logOutcome, d.outcome).Int(logAttempts, d.attempts).
			Str(logPrefill, d.prefill).Str(logDecode, d.decode).Float64(logDuration, durationMS(elapsed))
		if d.attempts > 0 {
			ev.Int64("prefill_generation", d.pGen).Int64("decode_generation", d.dGen)
		}
		if len(d.failed) > 0 {
			ev.Strs("failed_attempts", d.failed)
		}
		if id := d.traceID(); id != "" {
			ev.Str(logTraceID, id)
		}
		if sampled {
			ev.Int("sampled_1_in", rt.cfg.LogServedEvery)
		}
		if u := &d.usage; d.outcome == outcomeOK && (u.seenP || u.seenC) {
			ev.Int64("prompt_tokens", u.prompt).Int64("completion_tokens", u.completion)
		}
		if d.outcome == outcomeOK && d.kvBlocks >= 0 {
			ev.Int("kv_blocks", d.kvBlocks)
		}
		if p := d.prompt; p != nil && p.scored {
			ev.Int("held_tokens", p.cached).Int("tokenized", len(p.tokens))
		}
		if f := d.lastFail; f != nil && d.outcome != outcomeOK {
			ev.Str(logFailure, f.kind.String()).Str(logLeg, f.leg.String())
			if f.err != nil {
				ev.AnErr("upstream_error", f.err)
			}
		}
		ev.Msg("request")
	}
}

// pairServed records that the pair served a request (pair_stats.go) and
// counts the KV blocks its vLLM prefill handed the decode.
func (d *dispatch) pairServed() {
	d.stats.at.Store(d.rt.cfg.Now().UnixNano())
	if d.kvBlocks > 0 {
		d.stats.kvBlocks.Add(float64(d.kvBlocks))
	}
}

// servedEvent is the event a served request's line goes to: info for the
// ones LogServedEvery picks (sampled when it picks one in N > 1), else
// debug.
func (rt *Router) servedEvent() (ev *zerolog.Event, sampled bool) {
	switch n := uint64(rt.cfg.LogServedEvery); {
	case n == 1:
		return rt.log.Info(), false // every one: no shared counter to bump
	case n == 0 || rt.served.Add(1)%n != 0:
		return rt.log.Debug(), false
	}
	return rt.log.Info(), true
}

// durationMS is a duration as logged: milliseconds, to the microsecond.
func durationMS(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1e3
}

// readBody reads the client's body, refusing one over MaxBodyBytes. The
// buffer grows with what actually arrives: the declared Content-Length only
// caps the first allocation at readBodyInitial, so a client that declares a
// large body and sends a trickle holds almost nothing. The buffer is not
// pooled: it is kept for retries, so pooling would pin a large buffer to
// every open stream.
func (rt *Router) readBody(r *http.Request) ([]byte, *apiError) {
	limit := rt.cfg.MaxBodyBytes
	tooLarge := func() *apiError {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Message: "request body exceeds " + strconv.FormatInt(limit, 10) + " bytes",
			Type: "invalid_request_error", Code: codeBodyTooLarge}
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	buf := make([]byte, 0, firstBufferSize(r.ContentLength, limit+1))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, tooLarge()
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			switch {
			case errors.As(err, &mbe):
				return nil, tooLarge()
			case errors.Is(err, os.ErrDeadlineExceeded):
				return nil, &apiError{Status: http.StatusRequestTimeout, Message: "the request body did not arrive in time",
					Type: "invalid_request_error", Code: codeBodyTimeout}
			}
			return nil, badRequest("reading the request body: "+err.Error(), "", "invalid_request_body")
		}
	}
}

// readBodyInitial is the most readBody and readKeep allocate before bytes
// arrive.
const readBodyInitial = 64 << 10

// firstBufferSize is the buffer for a body of the declared length (-1:
// unknown) before any of it has arrived: all of it with a byte to see its
// end without growing, but at most readBodyInitial and max, so that a peer
// that declares a large body and sends a trickle costs only what arrives
// (it may declare up to 2^63-1 bytes). An unknown length starts at 512.
func firstBufferSize(declared, max int64) int64 {
	if declared < 0 {
		return min(512, max)
	}
	return min(min(declared, readBodyInitial-1)+1, max)
}

func (rt *Router) getRelayBuf() *[]byte  { return rt.bufs.Get().(*[]byte) }
func (rt *Router) putRelayBuf(b *[]byte) { rt.bufs.Put(b) }

// requestID returns the request's one ID. Behind the control plane its
// middleware has chosen it (the client's valid X-Request-Id or a new one),
// put it in the context and answered it; the router used on its own (Routes)
// applies the same rule here and answers it itself.
func requestID(w http.ResponseWriter, r *http.Request) string {
	if id, ok := pdproto.RequestIDFromContext(r.Context()); ok {
		return id
	}
	id := pdproto.AcceptRequestID(r.Header.Get(pdproto.RequestIDHeader))
	w.Header().Set(pdproto.RequestIDHeader, id)
	return id
}

// errText is what of an engine's error answer is worth recording, cleaned
// so that the registry takes it: the cut may split a character, and an
// engine's body may hold any bytes, which the registry would refuse.
func errText(b []byte) string {
	if len(b) > errTextLimit {
		b = b[:errTextLimit]
	}
	return registry.CleanText(string(b), errTextLimit)
}
