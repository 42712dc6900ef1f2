package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

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
			return &failure{kind: failClientGone, leg: legDecode, err: err}
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
