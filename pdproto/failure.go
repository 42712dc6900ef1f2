package pdproto

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// MissingMemKindMessage is the RuntimeError text SGLang's NIXL connector
// raises when a decode's registration on the prefill side left its
// destination with no memory kind (transfer raises the same text).
const MissingMemKindMessage = transfer.MissingMemKindMessage

// Leg is one half of a PD request.
type Leg uint8

// Legs.
const (
	LegPrefill Leg = iota
	LegDecode
)

func (l Leg) String() string {
	if l == LegPrefill {
		return "prefill"
	}
	return "decode"
}

// Class is what an engine's failure means for routing.
type Class uint8

// Classes.
const (
	// ClassNone: not a failure (or one that is not the router's to act on,
	// such as a graceful abort without a status).
	ClassNone Class = iota
	// ClassMissingMemKind: SGLang's "Missing NIXL destination KV memory
	// kind"; the decode's registration is broken (the stale rule).
	ClassMissingMemKind
	// ClassTransfer: the KV transfer between this prefill and this decode
	// failed for another reason; a failure of the pair, not of either peer.
	ClassTransfer
	// ClassOverload: 429, or 503 with Retry-After (or a 503 abort): try
	// elsewhere, count against nobody.
	ClassOverload
	// ClassRefused: the engine refused the request (4xx): the client's.
	ClassRefused
	// ClassEngine: any other engine failure, the peer's.
	ClassEngine
)

func (c Class) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassMissingMemKind:
		return "missing_mem_kind"
	case ClassTransfer:
		return "transfer"
	case ClassOverload:
		return "overload"
	case ClassRefused:
		return "refused"
	case ClassEngine:
		return "engine"
	}
	return "unknown"
}

// Blame is whom a failure counts against: what a retry of the request
// avoids. (The router's breakers count the same peer or pair, except for
// an overload: a busy engine is not a broken one.)
type Blame uint8

// Blames.
const (
	// BlameNone: nobody (the client's own error, or a failure that says
	// nothing of the engines).
	BlameNone Blame = iota
	// BlamePeer: the engine of the leg that failed; another pair without
	// it is tried.
	BlamePeer
	// BlamePair: the pair, not either engine: SGLang's broken registration
	// is per (prefill, decode agent), and a failed KV transfer says nothing
	// of the decode's other prefills; another pair is tried, the decode
	// with another prefill included.
	BlamePair
)

// Blame is the one rule of whom a class of failure counts against.
func (c Class) Blame() Blame {
	switch c {
	case ClassMissingMemKind, ClassTransfer:
		return BlamePair
	case ClassOverload, ClassEngine:
		return BlamePeer
	}
	return BlameNone
}

// Failure is one classified engine failure.
type Failure struct {
	Class Class
	// Status is the HTTP status of the answer, or the status an error event
	// carries (500 when it names none).
	Status int
	// Message is the engine's error message, bounded by MessageLimit.
	Message string
}

// MessageLimit bounds Failure.Message.
const MessageLimit = 4 << 10

// Messages that name a KV transfer failure: SGLang's scheduler aborts a
// request with these (disaggregation/prefill.py
// process_disagg_prefill_inflight_queue and process_prefill_chunk,
// disaggregation/decode.py DecodeTransferQueue.pop_transferred), with the
// connector's exception appended as " with exception <text>".
const (
	sglangPrefillTransferFailed  = "Prefill transfer failed for request"
	sglangPrefillBootstrapFailed = "Prefill bootstrap failed for request"
	sglangDecodeTransferFailed   = "Decode transfer failed for request"
)

// ClassifyAnswer classifies an answer whose HTTP status is not 2xx, from
// engine on leg; retryAfter says whether it carried a Retry-After header.
func ClassifyAnswer(engine registry.Engine, leg Leg, status int, retryAfter bool, body []byte) Failure {
	f := Failure{Status: status, Message: answerMessage(body)}
	switch {
	case status == 429 || (status == 503 && retryAfter):
		f.Class = ClassOverload
	case status >= 400 && status < 500 && status != 408:
		f.Class = ClassRefused
	default:
		f.Class = classifyMessage(engine, leg, f.Message)
	}
	return f
}

// ClassifyEvent classifies the payload of one SSE event of an answer that
// began with 200: an error event of an OpenAI stream (both engines), or a
// /generate event whose finish_reason is an abort with a status (SGLang).
// It returns false for every other event, including successful ones whose
// text happens to quote an error: only the event's structure counts.
func ClassifyEvent(engine registry.Engine, leg Leg, data []byte) (Failure, bool) {
	if !bytes.Contains(data, []byte(`"error"`)) && !bytes.Contains(data, []byte(`"abort"`)) {
		return Failure{}, false
	}
	var ev struct {
		Error    json.RawMessage `json:"error"`
		MetaInfo *struct {
			FinishReason json.RawMessage `json:"finish_reason"`
		} `json:"meta_info"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return Failure{}, false
	}
	var status int
	var msg string
	switch {
	case len(ev.Error) > 0 && string(ev.Error) != "null":
		var info errorInfo
		if json.Unmarshal(ev.Error, &info) == nil {
			status, msg = info.code(), info.Message
		} else if s, ok := jsonString(ev.Error); ok {
			msg = s
		}
		if status == 0 {
			status = 500
		}
	case ev.MetaInfo != nil && len(ev.MetaInfo.FinishReason) > 0:
		var fr FinishReason
		if json.Unmarshal(ev.MetaInfo.FinishReason, &fr) != nil || fr.Type != FinishAbort || fr.StatusCode == 0 {
			// SGLang's OpenAI layer passes a graceful abort (no status)
			// through as an ordinary finish; so does the router.
			return Failure{}, false
		}
		status, msg = fr.StatusCode, fr.Message
	default:
		return Failure{}, false
	}
	f := Failure{Status: status, Message: bound(msg)}
	switch {
	case status == 429 || status == 503:
		f.Class = ClassOverload
	case status >= 400 && status < 500 && status != 408:
		f.Class = ClassRefused
	default:
		f.Class = classifyMessage(engine, leg, f.Message)
	}
	return f, true
}

// classifyMessage classifies a server-side failure by its message.
func classifyMessage(engine registry.Engine, leg Leg, msg string) Class {
	if engine == registry.EngineVLLM {
		// vLLM never raises SGLang's memory-kind error. Its NIXL failures
		// (handshake, transfer, a KV load failed under
		// kv_load_failure_policy=fail) reach the client only as the
		// decode's "Internal server error", indistinguishable from any other
		// decode error; after a good prefill the KV load is the step that
		// depends on the pair, so a decode failure is the pair's.
		if leg == LegDecode {
			return ClassTransfer
		}
		return ClassEngine
	}
	switch {
	case strings.Contains(msg, MissingMemKindMessage):
		return ClassMissingMemKind
	case strings.Contains(msg, sglangPrefillTransferFailed),
		strings.Contains(msg, sglangPrefillBootstrapFailed),
		strings.Contains(msg, sglangDecodeTransferFailed):
		return ClassTransfer
	}
	return ClassEngine
}

// errorInfo is an error object as both engines write it: vLLM's ErrorInfo
// and SGLang's ErrorResponse share message, type and code.
type errorInfo struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

func (e *errorInfo) code() int {
	n, err := strconv.Atoi(strings.Trim(string(e.Code), `"`))
	if err != nil {
		return 0
	}
	return n
}

// answerMessage extracts the error message of a non-2xx answer: vLLM's and
// OpenAI's {"error": {"message"}}, SGLang's flat {"message"} (protocol.py
// ErrorResponse) or FastAPI's {"detail"}; any other body is its own
// message.
func answerMessage(body []byte) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message *string         `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	t := bytes.TrimSpace(body)
	if len(t) > 0 && t[0] == '{' && json.Unmarshal(t, &v) == nil {
		if len(v.Error) > 0 {
			var info errorInfo
			if json.Unmarshal(v.Error, &info) == nil && info.Message != "" {
				return bound(info.Message)
			}
			if s, ok := jsonString(v.Error); ok {
				return bound(s)
			}
		}
		if v.Message != nil {
			return bound(*v.Message)
		}
		if s, ok := jsonString(v.Detail); ok {
			return bound(s)
		}
	}
	return bound(string(t))
}

func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func bound(s string) string {
	if len(s) > MessageLimit {
		return s[:MessageLimit]
	}
	return s
}
