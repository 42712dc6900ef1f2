package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// An attempt has two legs: a prefill and a decode on the pair's engines.
// This file is everything a leg does on the wire, in the order a request
// meets it: where a leg's request goes and what it carries, the leg's span,
// how an engine's answer is classified, then vLLM's protocol (prefill, then
// decode), SGLang's (both at once), the decode's answer relayed, and last
// the bodies sent, built from the client's bytes.

// legTarget is where one route's legs go on an engine, parsed once per
// spec rather than once per request.
type legTarget struct {
	url string // as registered, with the route's path
	// plain: an http:// URL, whose requests the router's own transport
	// sends from the parts below; any other goes through an http.Request.
	plain bool
	addr  string // host:port to dial
	host  string // the Host field
	uri   string // the request target
}

func newLegTarget(raw string) legTarget {
	tg := legTarget{url: raw}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return tg // newUpstream reports what is wrong with it
	}
	tg.plain, tg.addr, tg.host, tg.uri = true, httpwire.DialAddr(u), u.Host, u.RequestURI()
	return tg
}

// legRequest is one leg's request to be sent (roundTrip): on a plain
// target with the router's own transport, its parts; else an http.Request.
type legRequest struct {
	ctx  context.Context
	tg   *legTarget
	body []byte
	req  *http.Request
}

// newUpstream builds one leg's request.
func (d *dispatch) newUpstream(ctx context.Context, tg *legTarget, body []byte) (legRequest, error) {
	if d.rt.ownedTr != nil && tg.plain {
		return legRequest{ctx: ctx, tg: tg, body: body}, nil
	}
	ub := httpwire.NewRequestBody(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.url, ub)
	if err != nil {
		return legRequest{}, err
	}
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return httpwire.NewRequestBody(body), nil }
	h := newFields(req.Header, 6)
	d.legFields(ctx, h.set)
	return legRequest{req: req}, nil
}

// roundTrip sends a leg's request and returns the engine's answer.
func (d *dispatch) roundTrip(lr legRequest) (*http.Response, error) {
	if lr.req != nil {
		return d.rt.transport.RoundTrip(lr.req)
	}
	hb := httpwire.HeadBuf()
	head := d.appendLegHead(*hb, lr)
	defer httpwire.PutHeadBuf(hb, head)
	return d.rt.ownedTr.Post(lr.ctx, lr.tg.addr, head, lr.body)
}

// appendLegHead writes the head of lr, a request without an http.Request:
// the one appendRequestHead would write from newUpstream's.
func (d *dispatch) appendLegHead(b []byte, lr legRequest) []byte {
	b = httpwire.AppendRequestLine(b, http.MethodPost, lr.tg.uri, lr.tg.host, len(lr.body))
	d.legFields(lr.ctx, func(k, v string) { b = httpwire.AppendField(b, k, v) })
	return append(b, "\r\n"...)
}

// legFields gives add each field of a leg's request but its framing: the
// body's type, the request's ID, the engines' credentials, and the trace
// context (the leg's span's in ctx, else the client's own).
func (d *dispatch) legFields(ctx context.Context, add func(k, v string)) {
	add("Content-Type", "application/json")
	add(pdproto.RequestIDHeader, d.rid)
	if d.rt.upstreamAuth != "" {
		add("Authorization", d.rt.upstreamAuth)
	}
	if d.span != nil {
		h := make(http.Header, 2)
		injectSpan(ctx, h)
		for k, vs := range h {
			for _, v := range vs {
				add(k, v)
			}
		}
	} else if tp, ts := d.passedTrace(); tp != "" {
		add(traceparentField, tp)
		if ts != "" {
			add(tracestateField, ts)
		}
	}
}

// transportFailure classifies an error of a leg that got no answer.
func (d *dispatch) transportFailure(l leg, err error) *failure {
	if d.ctx.Err() != nil {
		return &failure{kind: failClientGone, leg: l, err: err}
	}
	if l == legDecode && d.actx != nil && errors.Is(d.actx.Cause(), errDecodeFirstByte) {
		return &failure{kind: failPair, leg: legDecode, err: errDecodeFirstByte}
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return &failure{kind: failTimeout, leg: l, err: err}
	}
	return &failure{kind: failTransport, leg: l, err: err}
}

// statusFailure classifies a non-2xx answer of engine on leg l; it reads (a
// bounded part of) the body.
func (d *dispatch) statusFailure(engine registry.Engine, l leg, resp *http.Response) *failure {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
	pf := pdproto.ClassifyAnswer(engine, l.proto(), resp.StatusCode, resp.Header.Get("Retry-After") != "", body)
	return &failure{kind: kindOf(pf.Class), leg: l, status: resp.StatusCode, header: resp.Header, body: body}
}

// eventFailure is the failure an SSE event of a 200 answer carries, or nil.
// A refusal inside a stream is the client's answer, relayed as it is.
func eventFailure(engine registry.Engine, l leg, resp *http.Response, event []byte) *failure {
	data := pdproto.EventData(event)
	if data == nil {
		return nil
	}
	pf, ok := pdproto.ClassifyEvent(engine, l.proto(), data)
	if !ok || pf.Class == pdproto.ClassRefused || pf.Class == pdproto.ClassNone {
		return nil
	}
	return &failure{kind: kindOf(pf.Class), leg: l, status: pf.Status, header: resp.Header, body: data}
}

// firstEventFailure scans the complete events of b for a failure.
func firstEventFailure(engine registry.Engine, l leg, resp *http.Response, b []byte) *failure {
	for len(b) > 0 {
		ev, rest, complete := pdproto.NextEvent(b)
		if !complete {
			return nil
		}
		if f := eventFailure(engine, l, resp, ev); f != nil {
			return f
		}
		b = rest
	}
	return nil
}

// kindOf maps pdproto's classes to the router's failure kinds.
func kindOf(c pdproto.Class) failKind {
	switch c {
	case pdproto.ClassMissingMemKind:
		return failMemKind
	case pdproto.ClassTransfer:
		return failPair
	case pdproto.ClassOverload:
		return failOverload
	case pdproto.ClassRefused:
		return failUpstream4xx
	}
	return failStatus
}

// readKeep reads an answer's body to the end, keeping its first keep bytes.
func readKeep(resp *http.Response, keep int64) ([]byte, error) {
	buf := make([]byte, 0, firstBufferSize(resp.ContentLength, keep))
	for int64(len(buf)) < keep {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(cap(buf)), keep-int64(len(buf)))))
		}
		n, err := resp.Body.Read(buf[len(buf):int(min(int64(cap(buf)), keep))])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	_, err := io.Copy(io.Discard, resp.Body)
	return buf, err
}

// legSpan is the span of one leg of an attempt; the zero value (tracing
// off) does nothing.
type legSpan struct {
	span trace.Span
	leg  leg
}

// startLeg opens the span of leg l to peer ref at url, a child of the
// attempt's, and returns the context that carries it: newUpstream injects
// it into the engine's request. With tracing off it returns ctx as it is.
func (d *dispatch) startLeg(ctx context.Context, l leg, ref *peerRef, tg *legTarget) (context.Context, legSpan) {
	if d.attemptSpan == nil {
		return ctx, legSpan{}
	}
	spanCtx, span := d.rt.tracer.Start(trace.ContextWithSpan(ctx, d.attemptSpan), l.String(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrLeg.String(l.String()), attrPeerID.String(ref.peer.ID), attrPeerName.String(ref.peer.Name),
			attrGeneration.Int64(ref.peer.Generation), attrURLFull.String(tg.url), attrHTTPMethod.String(http.MethodPost)))
	if a, ok := ctx.(*attemptCtx); ok {
		spanCtx = hookedCtx{spanCtx, &a.Hooks}
	}
	return spanCtx, legSpan{span: span, leg: l}
}

// answered records the engine's status code.
func (s legSpan) answered(status int) {
	if s.span != nil {
		s.span.SetAttributes(attrHTTPStatus.Int(status))
	}
}

// end closes the leg's span: f is the attempt's failure, recorded as this
// leg's when it is, or as a cancellation when the other leg failed first.
func (s legSpan) end(f *failure, size attribute.KeyValue) {
	if s.span == nil {
		return
	}
	switch {
	case f == nil:
		s.span.SetAttributes(size)
	case f.leg == s.leg:
		setFailure(s.span, f)
	default:
		s.span.SetAttributes(attrCancelled.Bool(true))
	}
	s.span.End()
}

// cancelled closes the leg's span as cut short by the other leg's failure
// or the client leaving.
func (s legSpan) cancelled() {
	if s.span == nil {
		return
	}
	s.span.SetAttributes(attrCancelled.Bool(true))
	s.span.End()
}

// vllmPrefillAnswerLimit bounds a vLLM prefill's answer (one token).
const vllmPrefillAnswerLimit = 4 << 20

// runVLLM runs one attempt of vLLM's NixlConnector protocol: the prefill
// first, for one token and not streamed, asking it to keep the KV for a
// remote decode; then the decode with the client's body plus the
// kv_transfer_params the prefill answered with. Both legs carry the same
// X-Request-Id. vLLM's NIXL failures (a handshake or READ that failed, a KV
// load refused under kv_load_failure_policy=fail) reach the router as the
// decode's error and count against the pair, never as SGLang's memory-kind
// rule (pdproto.ClassifyAnswer).
func (d *dispatch) runVLLM(pr *pair) (f *failure) {
	rt, q := d.rt, d.q
	kv, f := d.vllmPrefill(pr)
	if f != nil {
		return f
	}
	body := appendVLLMDecodeBody(make([]byte, 0, len(q.body)+len(kv)+64), q, kv)
	actx := newAttemptCtx(d.ctx)
	defer actx.cancel(errAttemptOver)
	d.actx = actx
	if q.stream {
		actx.armFirstByte(rt.cfg.DecodeFirstByteTimeout)
	}
	start := rt.cfg.Now()
	dctx, ls := d.startLeg(actx, legDecode, pr.d, &pr.d.ep.targets[d.route])
	defer func() { ls.end(f, attrBodySize.Int64(d.sent)) }()
	req, err := d.newUpstream(dctx, &pr.d.ep.targets[d.route], body)
	if err != nil {
		return &failure{kind: failProtocol, leg: legDecode, err: err}
	}
	resp, err := d.roundTrip(req)
	if err != nil {
		d.observeDecode("vllm", start, "error")
		return d.transportFailure(legDecode, err)
	}
	defer resp.Body.Close()
	ls.answered(resp.StatusCode)
	if resp.StatusCode >= 300 {
		d.observeDecode("vllm", start, "error")
		return d.statusFailure(registry.EngineVLLM, legDecode, resp)
	}
	f = d.deliverDecode(registry.EngineVLLM, resp, nil)
	switch {
	case f == nil:
		d.observeDecode("vllm", start, "ok")
	case f.kind != failClientGone:
		d.observeDecode("vllm", start, "error")
	}
	return f
}

// vllmPrefill runs the prefill leg and returns the raw kv_transfer_params of
// its answer (nil when it sent none).
func (d *dispatch) vllmPrefill(pr *pair) (kv []byte, f *failure) {
	rt, q := d.rt, d.q
	start := rt.cfg.Now()
	result := "error"
	ctx, ls := d.startLeg(d.ctx, legPrefill, pr.p, &pr.p.ep.targets[d.route])
	var ans []byte
	defer func() {
		d.prefillEnded()
		rt.m.prefillSeries("vllm", result).Observe(rt.cfg.Now().Sub(start).Seconds())
		ls.end(f, attrAnswerKept.Int(len(ans)))
	}()
	ctx, cancel := context.WithTimeout(ctx, rt.cfg.PrefillTimeout)
	defer cancel()
	body := appendVLLMPrefillBody(make([]byte, 0, len(q.body)+256), q)
	req, err := d.newUpstream(ctx, &pr.p.ep.targets[d.route], body)
	if err != nil {
		return nil, &failure{kind: failProtocol, leg: legPrefill, err: err}
	}
	resp, err := d.roundTrip(req)
	if err != nil {
		return nil, d.transportFailure(legPrefill, err)
	}
	defer resp.Body.Close()
	ls.answered(resp.StatusCode)
	if resp.StatusCode >= 300 {
		return nil, d.statusFailure(registry.EngineVLLM, legPrefill, resp)
	}
	ans, err = readKeep(resp, vllmPrefillAnswerLimit)
	if err != nil {
		return nil, d.transportFailure(legPrefill, err)
	}
	ms, err := scanTopObject(ans, nil)
	if err != nil {
		return nil, &failure{kind: failProtocol, leg: legPrefill, status: resp.StatusCode, body: ans,
			err: errors.New("prefill answer is not a JSON object: " + err.Error())}
	}
	result = "ok"
	if m := find(ms, "kv_transfer_params"); m != nil {
		kv = m.value(ans)
		d.kvBlocks = blockCount(kv)
		return kv, nil
	}
	return nil, nil
}

// blockCount is how many KV blocks a vLLM prefill's kv_transfer_params
// hand the decode: the IDs in remote_block_ids, one list per KV cache group
// (vLLM's NixlConnector request_finished); -1 when they name none.
func blockCount(kv []byte) int {
	ms, err := scanTopObject(kv, nil)
	if err != nil {
		return -1
	}
	m := find(ms, "remote_block_ids")
	if m == nil {
		return -1
	}
	n, inID := 0, false
	for _, c := range m.value(kv) {
		switch c {
		case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			if !inID {
				n++
			}
			inID = true
		case '[', ']', ',', ' ', '\t', '\n', '\r':
			inID = false
		default:
			return -1 // null, or not lists of block IDs
		}
	}
	return n
}

// prefillResult is how a prefill leg ended.
type prefillResult struct {
	fail *failure
	body []byte // the answer, bounded; all of it when logprobs are merged
	// panicked is what the leg's goroutine panicked with (fail is then
	// set too, so that the decode is cancelled): wait raises it again on
	// the dispatch's goroutine.
	panicked any
}

// prefillLeg is a prefill running concurrently with its decode.
type prefillLeg struct {
	ch   chan prefillResult
	res  prefillResult
	done bool
}

// wait returns the prefill's result, blocking until it is in. A panic of
// the leg's goroutine is raised again here, so that it ends the request as
// any panic in the router does (internal_error: no retry on another pair,
// no breaker failure against engines that did nothing wrong).
func (l *prefillLeg) wait() prefillResult {
	if !l.done {
		l.res = <-l.ch
		l.done = true
	}
	if p := l.res.panicked; p != nil {
		l.res.panicked = nil // once: wait is also deferred
		panic(fmt.Sprintf("prefill leg: %v", p))
	}
	return l.res
}

// runSGLang runs one attempt of SGLang's protocol: the same body, carrying
// the prefill's bootstrap address and a fresh room, goes to both engines at
// once; the decode's answer is relayed once the prefill has answered in full
// without error, so that a failed transfer is retried on another pair rather
// than streamed as a 200. Either leg failing cancels the other at once; a
// streamed decode that stays silent too long after a good prefill is cut by
// the first-byte deadline.
func (d *dispatch) runSGLang(pr *pair) (f *failure) {
	rt, q := d.rt, d.q
	body := appendSGLangBody(make([]byte, 0, len(q.body)+160+q.bootstrapCount()*48), q, pr.p.ep.hostJSON, pr.p.ep.port)
	engine := pr.d.ep.protocol

	actx := newAttemptCtx(d.ctx)
	cancel := actx.cancel
	d.actx = actx
	pl := &prefillLeg{ch: make(chan prefillResult, 1)}
	defer pl.wait()
	defer cancel(errAttemptOver)
	go func() {
		res := d.prefillGuarded(actx, pr, body)
		if res.fail != nil {
			cancel(errPrefillLegFailed)
		} else if q.stream {
			actx.armFirstByte(rt.cfg.DecodeFirstByteTimeout)
		}
		pl.ch <- res
	}()

	// prefillFailedFirst returns the prefill's failure when it is what
	// brought the attempt down.
	prefillFailedFirst := func() *failure {
		res := pl.wait()
		if res.fail != nil && errors.Is(actx.Cause(), errPrefillLegFailed) {
			return res.fail
		}
		return nil
	}

	start := rt.cfg.Now()
	dctx, ls := d.startLeg(actx, legDecode, pr.d, &pr.d.ep.targets[d.route])
	defer func() { ls.end(f, attrBodySize.Int64(d.sent)) }()
	req, err := d.newUpstream(dctx, &pr.d.ep.targets[d.route], body)
	if err != nil {
		cancel(errDecodeLegFailed)
		return &failure{kind: failProtocol, leg: legDecode, err: err}
	}
	resp, err := d.roundTrip(req)
	if err != nil {
		f := d.transportFailure(legDecode, err)
		cancel(errDecodeLegFailed)
		if pf := prefillFailedFirst(); pf != nil {
			return pf
		}
		d.observeDecode("sglang", start, "error")
		return f
	}
	defer resp.Body.Close()
	ls.answered(resp.StatusCode)
	if resp.StatusCode >= 300 {
		d.actx.firstByte()
		f := d.statusFailure(engine, legDecode, resp)
		cancel(errDecodeLegFailed)
		if pf := prefillFailedFirst(); pf != nil {
			return pf
		}
		d.observeDecode("sglang", start, "error")
		return f
	}

	f = d.deliverDecode(engine, resp, pl)
	switch {
	case f == nil:
		d.observeDecode("sglang", start, "ok")
	case f.kind != failClientGone && f.leg == legDecode:
		d.observeDecode("sglang", start, "error")
	}
	return f
}

// prefillGuarded is sglangPrefill on the goroutine runSGLang starts for it,
// where nothing else would catch a panic: one (a fault of the router's,
// likely on an engine's odd answer) fails this leg, which cancels the
// decode, and goes back to the dispatch (prefillLeg.wait) instead of ending
// the process and every request in it.
func (d *dispatch) prefillGuarded(a *attemptCtx, pr *pair, body []byte) (res prefillResult) {
	defer func() {
		if p := recover(); p != nil {
			d.rt.log.Error().Str(logRequestID, d.rid).Str("peer", pr.p.peer.Name).Interface("panic", p).
				Str("stack", string(debug.Stack())).Msg("panic in a prefill leg; the request fails")
			res = prefillResult{fail: &failure{kind: failProtocol, leg: legPrefill, err: fmt.Errorf("panic in the prefill leg: %v", p)}, panicked: p}
		}
	}()
	return d.sglangPrefill(a, pr, body)
}

// sglangPrefill posts the prefill leg and reads its answer to the end.
func (d *dispatch) sglangPrefill(a *attemptCtx, pr *pair, body []byte) prefillResult {
	rt := d.rt
	start := rt.cfg.Now()
	ctx, ls := d.startLeg(a, legPrefill, pr.p, &pr.p.ep.targets[d.route])
	a.limitPrefill(rt.cfg.PrefillTimeout)
	defer a.prefillDone() // also when the leg panics (prefillGuarded)
	res := d.prefillLegResult(ctx, pr, body, ls)
	a.prefillDone()
	d.prefillEnded()
	result := "ok"
	if res.fail != nil {
		if errors.Is(a.Cause(), errDecodeLegFailed) || res.fail.kind == failClientGone {
			result = "cancelled"
		} else {
			result = "error"
		}
	}
	if result == "cancelled" {
		ls.cancelled()
	} else {
		ls.end(res.fail, attrAnswerKept.Int(len(res.body)))
	}
	rt.m.prefillSeries("sglang", result).Observe(rt.cfg.Now().Sub(start).Seconds())
	return res
}

func (d *dispatch) prefillLegResult(ctx context.Context, pr *pair, body []byte, ls legSpan) prefillResult {
	engine := pr.p.ep.protocol
	req, err := d.newUpstream(ctx, &pr.p.ep.targets[d.route], body)
	if err != nil {
		return prefillResult{fail: &failure{kind: failProtocol, leg: legPrefill, err: err}}
	}
	resp, err := d.roundTrip(req)
	if err != nil {
		return prefillResult{fail: d.transportFailure(legPrefill, err)}
	}
	defer resp.Body.Close()
	ls.answered(resp.StatusCode)
	if resp.StatusCode >= 300 {
		return prefillResult{fail: d.statusFailure(engine, legPrefill, resp)}
	}
	keep := int64(prefillKeep)
	if d.q.logprob {
		keep = d.rt.cfg.MaxResponseBytes
	}
	kept, err := readKeep(resp, keep)
	if err != nil {
		return prefillResult{fail: d.transportFailure(legPrefill, err)}
	}
	// After a 200 a streamed prefill may still have failed: SGLang sends an
	// error event (OpenAI routes) or an abort event (/generate). Only an
	// event's structure counts: a successful answer may echo the prompt,
	// and a prompt must not be able to mark a decode stale.
	if d.q.stream {
		if f := firstEventFailure(engine, legPrefill, resp, kept); f != nil {
			return prefillResult{fail: f}
		}
	}
	return prefillResult{body: kept}
}

// readFirstEvent reads a streamed answer until its first event is complete,
// the answer ends, or limit bytes are in; every byte read counts as the
// decode's first byte.
func (d *dispatch) readFirstEvent(body io.Reader, buf []byte, limit int) ([]byte, error) {
	var acc []byte
	for {
		n, err := body.Read(buf)
		if n > 0 {
			d.actx.firstByte()
			acc = append(acc, buf[:n]...)
			if _, _, ok := pdproto.NextEvent(acc); ok || len(acc) > limit {
				return acc, nil
			}
		}
		if err != nil {
			return acc, err
		}
	}
}

// deliverDecode relays a decode's 2xx answer. With pl set (SGLang), nothing
// reaches the client before the prefill has answered without error. A
// streamed answer's first event is held until then, and not sent at all
// when it is itself a failure (SGLang's error or abort event, vLLM's error
// event): the attempt fails and another pair may serve the request.
func (d *dispatch) deliverDecode(engine registry.Engine, resp *http.Response, pl *prefillLeg) *failure {
	rt, q := d.rt, d.q
	// The buffer for the answer's first bytes; the relay that follows takes
	// its own for each read (see relay).
	bp := rt.getRelayBuf()
	held := true
	release := func() {
		if held {
			held = false
			rt.putRelayBuf(bp)
		}
	}
	defer release()
	buf := *bp

	waitPrefill := func() (prefillResult, *failure) {
		if pl == nil {
			return prefillResult{}, nil
		}
		res := pl.wait()
		return res, res.fail
	}
	merge := q.logprob && pl != nil && d.route == routeGenerate

	switch {
	case merge && !q.stream:
		// Both answers whole, merged, then sent.
		all, err := readKeep(resp, rt.cfg.MaxResponseBytes+1)
		d.actx.firstByte()
		if pf := pl.wait().fail; pf != nil {
			return pf
		}
		if err != nil {
			return d.transportFailure(legDecode, err)
		}
		if int64(len(all)) > rt.cfg.MaxResponseBytes {
			return &failure{kind: failProtocol, leg: legDecode, err: errors.New("decode answer too large to merge logprobs")}
		}
		if err := pdproto.CheckUnary(resp.Header.Get("Content-Type"), all, true); err != nil {
			return &failure{kind: failProtocol, leg: legDecode, status: resp.StatusCode, body: all[:min(len(all), errorBodyLimit)], err: err}
		}
		res, _ := waitPrefill()
		out := all
		if pre, err := prefillLogprobs(res.body); err == nil { // all is valid JSON: CheckUnary
			if m, err := mergeInputLogprobs(pre, all); err == nil {
				out = m
			}
		}
		d.commit(resp, len(out))
		if err := d.write(out); err != nil {
			return &failure{kind: failClientGone, leg: legDecode, err: err}
		}
		return nil

	case q.stream:
		limit := errorBodyLimit
		if merge {
			limit = int(min(rt.cfg.MaxResponseBytes, 1<<30))
		}
		acc, rerr := d.readFirstEvent(resp.Body, buf, limit)
		if rerr == nil || errors.Is(rerr, io.EOF) {
			if err := pdproto.CheckStreamStart(resp.Header.Get("Content-Type"), acc, rerr != nil); err != nil {
				// Garbage, or no stream at all: the decode's own failure,
				// judged without waiting for the prefill, and nothing of
				// it reaches the client.
				return &failure{kind: failProtocol, leg: legDecode, status: resp.StatusCode, body: acc[:min(len(acc), errorBodyLimit)], err: err}
			}
		}
		res, pf := waitPrefill()
		if pf != nil {
			return pf
		}
		if pl != nil && !merge {
			pl.res.body = nil // not needed without a logprob merge
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return d.transportFailure(legDecode, rerr)
		}
		if merge && len(acc) > limit {
			return &failure{kind: failProtocol, leg: legDecode, err: errors.New("first decode event too large")}
		}
		if f := firstEventFailure(engine, legDecode, resp, acc); f != nil {
			return f
		}
		first := acc
		if ev, rest, complete := pdproto.NextEvent(acc); merge && complete {
			if pre, err := prefillLogprobs(res.body); err == nil {
				first = append(mergeSSEEvent(ev, pre), rest...)
			}
		}
		d.commit(resp, -1)
		rb, _ := resp.Body.(relayBody)
		if err := d.send(first, d.mustFlush(rb, rerr)); err != nil {
			return sendFailure(err)
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		release()
		return d.relay(resp.Body)

	default:
		n, rerr := readFirst(resp.Body, buf)
		d.actx.firstByte()
		if rerr == nil || errors.Is(rerr, io.EOF) {
			if err := pdproto.CheckUnary(resp.Header.Get("Content-Type"), buf[:n], errors.Is(rerr, io.EOF)); err != nil {
				return &failure{kind: failProtocol, leg: legDecode, status: resp.StatusCode, body: slices.Clone(buf[:n]), err: err}
			}
		}
		if _, pf := waitPrefill(); pf != nil {
			return pf
		}
		if pl != nil {
			pl.res.body = nil // not needed without a logprob merge
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return d.transportFailure(legDecode, rerr)
		}
		cl := -1
		if errors.Is(rerr, io.EOF) {
			cl = n
		}
		d.commit(resp, cl)
		if err := d.write(buf[:n]); err != nil {
			return &failure{kind: failClientGone, leg: legDecode, err: err}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		release()
		return d.relay(resp.Body)
	}
}

// observeDecode records the decode leg's duration.
func (d *dispatch) observeDecode(proto string, start time.Time, result string) {
	d.rt.m.decodeSeries(proto, result).Observe(d.rt.cfg.Now().Sub(start).Seconds())
}

// The bodies sent to engines are the client's bytes with some top-level
// members dropped and the router's appended: no value the router does not
// own is decoded or re-encoded.

// appendMembersExcept writes "{" and every member of the client's object that
// drop does not claim, comma-separated; the caller appends its own members
// (each preceded by sep(dst)) and the closing brace.
func appendMembersExcept(dst []byte, q *request, drop func(key []byte) bool) []byte {
	dst = append(dst, '{')
	first := true
	for i := range q.members {
		m := &q.members[i]
		if drop(m.key) || (!q.modelGiven && string(m.key) == "model") {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		dst = append(dst, q.body[m.start:m.end]...)
		first = false
	}
	return dst
}

// sep appends the comma that separates a new member from the previous one.
func sep(dst []byte) []byte {
	if dst[len(dst)-1] != '{' {
		dst = append(dst, ',')
	}
	return dst
}

// appendModel adds the model the router chose for a request that named none.
func appendModel(dst []byte, q *request) []byte {
	if q.modelGiven || q.model == "" {
		return dst
	}
	dst = append(sep(dst), `"model":`...)
	return strconv.AppendQuote(dst, q.model)
}

func isBootstrapKey(k []byte) bool {
	switch string(k) {
	case "bootstrap_host", "bootstrap_port", "bootstrap_room":
		return true
	}
	return false
}

// bootstrapRoom draws a room uniformly from [0, 2^63), as SGLang's
// mini_lb does with random.randint(0, 2**63 - 1).
func bootstrapRoom() uint64 { return rand.Uint64() >> 1 }

// appendSGLangBody builds the body both legs of an SGLang pair receive: the
// client's members plus bootstrap_host, bootstrap_port and bootstrap_room,
// scalars for a single prompt and lists of bootstrapCount() for a batch or
// n > 1. hostJSON is the prefill's bootstrap host, already quoted.
func appendSGLangBody(dst []byte, q *request, hostJSON string, port int) []byte {
	dst = appendMembersExcept(dst, q, isBootstrapKey)
	dst = appendModel(dst, q)
	k := q.bootstrapCount()
	dst = append(sep(dst), `"bootstrap_host":`...)
	if k == 0 {
		dst = append(dst, hostJSON...)
		dst = append(dst, `,"bootstrap_port":`...)
		dst = appendPort(dst, port)
		dst = append(dst, `,"bootstrap_room":`...)
		dst = strconv.AppendUint(dst, bootstrapRoom(), 10)
		return append(dst, '}')
	}
	dst = append(dst, '[')
	for i := range k {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, hostJSON...)
	}
	dst = append(dst, `],"bootstrap_port":[`...)
	for i := range k {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendPort(dst, port)
	}
	dst = append(dst, `],"bootstrap_room":[`...)
	for i := range k {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, bootstrapRoom(), 10)
	}
	return append(dst, "]}"...)
}

func appendPort(dst []byte, port int) []byte {
	if port <= 0 {
		return append(dst, "null"...)
	}
	return strconv.AppendInt(dst, int64(port), 10)
}

func isVLLMPrefillDropped(k []byte) bool {
	switch string(k) {
	case "stream", "stream_options", "max_tokens", "max_completion_tokens",
		"min_tokens", "min_completion_tokens", "kv_transfer_params":
		return true
	}
	return false
}

func isKVTransferParams(k []byte) bool { return string(k) == "kv_transfer_params" }

// appendVLLMPrefillBody builds the prefill leg of a vLLM pair: one token,
// not streamed, without stream_options or the min-token fields prefills
// refuse, asking for remote decode.
func appendVLLMPrefillBody(dst []byte, q *request) []byte {
	dst = appendMembersExcept(dst, q, isVLLMPrefillDropped)
	dst = appendModel(dst, q)
	dst = append(sep(dst), `"stream":false,"max_tokens":1`...)
	if q.route == routeChat {
		dst = append(dst, `,"max_completion_tokens":1`...)
	}
	dst = append(dst, ',')
	dst = append(dst, pdproto.VLLMPrefillKVTransferParams...)
	return append(dst, '}')
}

// appendVLLMDecodeBody builds the decode leg of a vLLM pair: the client's
// body with the prefill's kv_transfer_params. Without them (a prefill that
// returned none) the decode computes the prompt itself, as vLLM's proxy does.
func appendVLLMDecodeBody(dst []byte, q *request, kvParams []byte) []byte {
	dst = appendMembersExcept(dst, q, isKVTransferParams)
	dst = appendModel(dst, q)
	if len(kvParams) > 0 && !isNull(kvParams) {
		dst = append(sep(dst), `"kv_transfer_params":`...)
		dst = append(dst, kvParams...)
	}
	return append(dst, '}')
}
