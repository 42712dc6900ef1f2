package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// prefillResult is how a prefill leg ended.
type prefillResult struct {
	fail *failure
	body []byte // the answer, bounded; all of it when logprobs are merged
}

// prefillLeg is a prefill running concurrently with its decode.
type prefillLeg struct {
	ch   chan prefillResult
	res  prefillResult
	done bool
}

// wait returns the prefill's result, blocking until it is in.
func (l *prefillLeg) wait() prefillResult {
	if !l.done {
		l.res = <-l.ch
		l.done = true
	}
	return l.res
}

// runSGLang runs one attempt of SGLang's protocol: the same body, carrying
// the prefill's bootstrap address and a fresh room, goes to both engines at
// once; the decode's answer is relayed once the prefill has answered in full
// without error, so that a failed transfer is retried on another pair rather
// than streamed as a 200. Either leg failing cancels the other at once.
func (d *dispatch) runSGLang(pr *pair) *failure {
	rt, q := d.rt, d.q
	body := appendSGLangBody(make([]byte, 0, len(q.body)+160+q.bootstrapCount()*48), q, pr.p.ep.hostJSON, pr.p.ep.port)

	actx, cancel := context.WithCancelCause(d.r.Context())
	pl := &prefillLeg{ch: make(chan prefillResult, 1)}
	defer pl.wait()
	defer cancel(errAttemptOver)
	go func() {
		res := d.sglangPrefill(actx, pr, body)
		if res.fail != nil {
			cancel(errPrefillLegFailed)
		}
		pl.ch <- res
	}()

	// prefillFailedFirst returns the prefill's failure when it is what
	// brought the attempt down.
	prefillFailedFirst := func() *failure {
		res := pl.wait()
		if res.fail != nil && errors.Is(context.Cause(actx), errPrefillLegFailed) {
			return res.fail
		}
		return nil
	}

	start := rt.cfg.Now()
	req, err := d.newUpstream(actx, pr.d.ep.urls[d.route], body)
	if err != nil {
		cancel(errDecodeLegFailed)
		return &failure{kind: failProtocol, leg: legDecode, err: err}
	}
	resp, err := rt.transport.RoundTrip(req)
	if err != nil {
		cancel(errDecodeLegFailed)
		if f := prefillFailedFirst(); f != nil {
			return f
		}
		d.observeDecode("sglang", start, "error")
		return d.transportFailure(legDecode, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		f := d.statusFailure(legDecode, resp)
		cancel(errDecodeLegFailed)
		if pf := prefillFailedFirst(); pf != nil {
			return pf
		}
		d.observeDecode("sglang", start, "error")
		return f
	}

	f := d.deliverDecode(resp, pl)
	switch {
	case f == nil:
		d.observeDecode("sglang", start, "ok")
	case f.kind != failClientGone && f.leg == legDecode:
		d.observeDecode("sglang", start, "error")
	}
	return f
}

// sglangPrefill posts the prefill leg and reads its answer to the end.
func (d *dispatch) sglangPrefill(ctx context.Context, pr *pair, body []byte) prefillResult {
	rt := d.rt
	start := rt.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, rt.cfg.PrefillTimeout)
	defer cancel()
	res := d.prefillLegResult(ctx, pr, body)
	result := "ok"
	if res.fail != nil {
		if errors.Is(context.Cause(ctx), errDecodeLegFailed) || res.fail.kind == failClientGone {
			result = "cancelled"
		} else {
			result = "error"
		}
	}
	rt.m.prefillDuration.WithLabelValues("sglang", result).Observe(rt.cfg.Now().Sub(start).Seconds())
	return res
}

func (d *dispatch) prefillLegResult(ctx context.Context, pr *pair, body []byte) prefillResult {
	req, err := d.newUpstream(ctx, pr.p.ep.urls[d.route], body)
	if err != nil {
		return prefillResult{fail: &failure{kind: failProtocol, leg: legPrefill, err: err}}
	}
	resp, err := d.rt.transport.RoundTrip(req)
	if err != nil {
		return prefillResult{fail: d.transportFailure(legPrefill, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return prefillResult{fail: d.statusFailure(legPrefill, resp)}
	}
	keep := int64(prefillKeep)
	if d.q.logprob {
		keep = d.rt.cfg.MaxResponseBytes
	}
	kept, err := readKeep(resp.Body, keep)
	if err != nil {
		return prefillResult{fail: d.transportFailure(legPrefill, err)}
	}
	// After a 200, only an error event counts: a successful answer may echo
	// the prompt, and a prompt must not be able to mark a decode stale.
	if hasSSEError(kept) {
		kind := failStatus
		if isMemKindError(kept) {
			kind = failMemKind
		}
		return prefillResult{fail: &failure{kind: kind, leg: legPrefill, status: resp.StatusCode, header: resp.Header, body: kept}}
	}
	return prefillResult{body: kept}
}

// deliverDecode relays a decode's 2xx answer. With pl set (SGLang), nothing
// reaches the client before the prefill has answered without error.
func (d *dispatch) deliverDecode(resp *http.Response, pl *prefillLeg) *failure {
	rt, q := d.rt, d.q
	bp := rt.getRelayBuf()
	defer rt.putRelayBuf(bp)
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
		all, err := readKeep(resp.Body, rt.cfg.MaxResponseBytes+1)
		if pf := pl.wait().fail; pf != nil {
			return pf
		}
		if err != nil {
			return d.transportFailure(legDecode, err)
		}
		if int64(len(all)) > rt.cfg.MaxResponseBytes {
			return &failure{kind: failProtocol, leg: legDecode, err: errors.New("decode answer too large to merge logprobs")}
		}
		res, _ := waitPrefill()
		out := all
		if pre, err := prefillLogprobs(res.body); err == nil {
			if _, err := scanTopValue(all); err == nil {
				if m, err := mergeInputLogprobs(pre, all); err == nil {
					out = m
				}
			}
		}
		d.commit(resp, len(out))
		if err := d.write(out); err != nil {
			return &failure{kind: failClientGone, leg: legDecode, err: err}
		}
		return nil

	case merge && q.stream:
		// The first event carries the prompt's logprobs.
		var acc []byte
		var rerr error
		for {
			n, err := resp.Body.Read(buf)
			acc = append(acc, buf[:n]...)
			if _, ok := firstSSEEvent(acc); ok {
				break
			}
			if err != nil {
				rerr = err
				break
			}
			if int64(len(acc)) > rt.cfg.MaxResponseBytes {
				rerr = errors.New("first decode event too large")
				break
			}
		}
		res, pf := waitPrefill()
		if pf != nil {
			return pf
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return d.transportFailure(legDecode, rerr)
		}
		ev, complete := firstSSEEvent(acc)
		first := acc
		if complete {
			if pre, err := prefillLogprobs(res.body); err == nil {
				merged := mergeSSEEvent(ev, pre)
				first = append(merged, acc[len(ev):]...)
			}
		}
		d.commit(resp, -1)
		if err := d.write(first); err != nil {
			return &failure{kind: failClientGone, leg: legDecode, err: err}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		return d.relay(resp.Body, buf)

	default:
		n, rerr := readFirst(resp.Body, buf)
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
		if errors.Is(rerr, io.EOF) && !q.stream {
			cl = n
		}
		d.commit(resp, cl)
		if err := d.write(buf[:n]); err != nil {
			return &failure{kind: failClientGone, leg: legDecode, err: err}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		return d.relay(resp.Body, buf)
	}
}

// observeDecode records the decode leg's duration.
func (d *dispatch) observeDecode(proto string, start time.Time, result string) {
	d.rt.m.decodeDuration.WithLabelValues(proto, result).Observe(d.rt.cfg.Now().Sub(start).Seconds())
}
