package router

import (
	"bytes"
	"errors"

	"github.com/pdplane/pdplane/pdproto"
)

// With return_logprob, SGLang's prefill computes the prompt's logprobs and
// the decode only its own; the client must see them joined, prefill first
// (mini_lb merges meta_info.input_token_logprobs the same way).

var errNoLogprobs = errors.New("no meta_info.input_token_logprobs")

// inputLogprobs returns the raw input_token_logprobs array of each answer in
// a /generate response: one for an object, one per element for a batch
// (array) answer.
func inputLogprobs(b []byte) ([][]byte, error) {
	i := skipWS(b, 0)
	if i >= len(b) {
		return nil, errNoLogprobs
	}
	if b[i] == '[' {
		elems, err := arrayElems(b, i, nil)
		if err != nil {
			return nil, err
		}
		out := make([][]byte, len(elems))
		for k, e := range elems {
			out[k], _ = objectLogprobs(b, e.start)
		}
		return out, nil
	}
	lp, err := objectLogprobs(b, i)
	if err != nil {
		return nil, err
	}
	return [][]byte{lp}, nil
}

// objectLogprobs finds meta_info.input_token_logprobs in the object at b[i].
func objectLogprobs(b []byte, i int) ([]byte, error) {
	ms, err := scanObjectAt(b, i, nil)
	if err != nil {
		return nil, err
	}
	mi := find(ms, "meta_info")
	if mi == nil || b[mi.valStart] != '{' {
		return nil, errNoLogprobs
	}
	inner, err := scanObjectAt(b, mi.valStart, nil)
	if err != nil {
		return nil, err
	}
	lp := find(inner, "input_token_logprobs")
	if lp == nil || b[lp.valStart] != '[' {
		return nil, errNoLogprobs
	}
	return lp.value(b), nil
}

// mergeInputLogprobs returns the decode's /generate answer (an object, or an
// array for a batch) with the prefill's input_token_logprobs put in front of
// its own. Answers without meta_info are left as they are.
func mergeInputLogprobs(prefill [][]byte, decode []byte) ([]byte, error) {
	i := skipWS(decode, 0)
	if i >= len(decode) {
		return decode, nil
	}
	out := make([]byte, 0, len(decode)+totalLen(prefill)+16)
	if decode[i] != '[' {
		if len(prefill) == 0 {
			return decode, nil
		}
		return mergeObject(out, decode, i, len(decode), prefill[0])
	}
	elems, err := arrayElems(decode, i, nil)
	if err != nil {
		return nil, err
	}
	prev := 0
	for k, e := range elems {
		if k >= len(prefill) || decode[e.start] != '{' {
			continue
		}
		out = append(out, decode[prev:e.start]...)
		out, err = mergeObject(out, decode, e.start, e.end, prefill[k])
		if err != nil {
			return nil, err
		}
		prev = e.end
	}
	return append(out, decode[prev:]...), nil
}

// mergeObject appends the object decode[start:end] to out with pre put in
// front of its meta_info.input_token_logprobs (added when missing).
func mergeObject(out, decode []byte, start, end int, pre []byte) ([]byte, error) {
	obj := decode[start:end]
	if len(pre) == 0 {
		return append(out, obj...), nil
	}
	ms, err := scanObjectAt(decode, start, nil)
	if err != nil {
		return nil, err
	}
	mi := find(ms, "meta_info")
	if mi == nil || decode[mi.valStart] != '{' {
		return append(out, obj...), nil
	}
	inner, err := scanObjectAt(decode, mi.valStart, nil)
	if err != nil {
		return nil, err
	}
	lp := find(inner, "input_token_logprobs")
	if lp == nil || decode[lp.valStart] != '[' {
		// Insert the prefill's list as the meta_info's first member.
		out = append(out, decode[start:mi.valStart+1]...)
		out = append(out, `"input_token_logprobs":`...)
		out = append(out, pre...)
		if len(inner) > 0 {
			out = append(out, ',')
		}
		return append(out, decode[mi.valStart+1:end]...), nil
	}
	out = append(out, decode[start:lp.valStart]...)
	out = appendJoinedArrays(out, pre, lp.value(decode))
	return append(out, decode[lp.end:end]...), nil
}

// appendJoinedArrays appends one JSON array holding a's elements then b's.
func appendJoinedArrays(out, a, b []byte) []byte {
	ai, bi := arrayInner(a), arrayInner(b)
	out = append(out, '[')
	out = append(out, ai...)
	if len(ai) > 0 && len(bi) > 0 {
		out = append(out, ',')
	}
	out = append(out, bi...)
	return append(out, ']')
}

// arrayInner is what lies between an array's brackets, trimmed.
func arrayInner(a []byte) []byte {
	if len(a) < 2 {
		return nil
	}
	return bytes.TrimSpace(a[1 : len(a)-1])
}

func totalLen(bs [][]byte) int {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	return n
}

// prefillLogprobs extracts the prompt logprobs from a prefill's answer,
// streamed (its first data event) or not.
func prefillLogprobs(body []byte) ([][]byte, error) {
	t := bytes.TrimSpace(body)
	if bytes.HasPrefix(t, []byte("data:")) {
		ev, _, _ := pdproto.NextEvent(t)
		d := pdproto.EventData(ev)
		if d == nil {
			return nil, errNoLogprobs
		}
		if _, err := scanTopValue(d); err != nil {
			return nil, err
		}
		return inputLogprobs(d)
	}
	if _, err := scanTopValue(t); err != nil {
		return nil, err
	}
	return inputLogprobs(t)
}

// mergeSSEEvent rewrites one decode SSE event with the prefill's logprobs;
// events that are not JSON (such as [DONE]) pass unchanged.
func mergeSSEEvent(event []byte, prefill [][]byte) []byte {
	d := pdproto.EventData(event)
	if d == nil || (d[0] != '{' && d[0] != '[') {
		return event
	}
	if _, err := scanTopValue(d); err != nil {
		return event
	}
	merged, err := mergeInputLogprobs(prefill, d)
	if err != nil {
		return event
	}
	return pdproto.AppendEvent(make([]byte, 0, len(merged)+8), merged)
}

// scanTopValue validates b as exactly one JSON value.
func scanTopValue(b []byte) (int, error) {
	i := skipWS(b, 0)
	end, err := scanValue(b, i, 0)
	if err != nil {
		return end, err
	}
	if j := skipWS(b, end); j != len(b) {
		return j, synErr(j, "data after the top-level value")
	}
	return end, nil
}
