package router

import (
	"math/rand/v2"
	"strconv"

	"github.com/pdplane/pdplane/pdproto"
)

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
