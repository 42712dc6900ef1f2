package router

import (
	"context"
	"errors"

	"github.com/pdplane/pdplane/registry"
)

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
		return m.value(ans), nil
	}
	return nil, nil
}
