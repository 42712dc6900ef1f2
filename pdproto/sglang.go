package pdproto

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Finish reason types of SGLang's meta_info.finish_reason.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
)

// FinishReason is SGLang's meta_info.finish_reason of a /generate answer:
// {"type": "length", "length": n}, {"type": "stop", "matched": ...}, or,
// for a request its scheduler aborted (FINISH_ABORT.to_json in
// managers/schedule_batch.py), {"type": "abort", "message": ...,
// "status_code": ...}. The status is an HTTPStatus, which orjson writes as
// its number; a graceful abort has none.
type FinishReason struct {
	Type       string `json:"type"`
	Length     int    `json:"length,omitempty"`
	Message    string `json:"message,omitempty"`
	StatusCode int    `json:"status_code,omitempty"`
}

// AbortFinish is the finish reason of a request SGLang aborted with status.
func AbortFinish(status int, message string) *FinishReason {
	return &FinishReason{Type: FinishAbort, Message: message, StatusCode: status}
}

// SGLangErrorBody is the body SGLang answers a non-streamed failure with:
// its flat ErrorResponse (entrypoints/openai/protocol.py), written by
// ORJSONResponse, so without spaces. A scheduler abort with status 500 or
// 503 becomes fastapi.HTTPException(status, message)
// (TokenizerManager._handle_abort_finish_reason), answered by
// http_server's HTTPException handler with type str(status) on /generate
// and by OpenAIServingBase's error response on the OpenAI routes.
func SGLangErrorBody(status int, typ, message string) []byte {
	b, _ := json.Marshal(struct {
		Object  string  `json:"object"`
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}{"error", message, typ, nil, status})
	return b
}

// SGLangStreamError is the payload of the error event SGLang's OpenAI
// routes send after 200 when the scheduler aborted the request with a
// status (serving_chat._generate_chat_stream and
// serving_completions._generate_completion_stream:
// create_streaming_error_response(message, code.name, code.value), which
// json.dumps {"error": ErrorResponse}, so with Python's ", " and ": ").
func SGLangStreamError(status int, message string) []byte {
	var b []byte
	b = append(b, `{"error": {"object": "error", "message": `...)
	b = appendJSONString(b, message)
	b = append(b, `, "type": `...)
	b = appendJSONString(b, StatusName(status))
	b = append(b, `, "param": null, "code": `...)
	b = strconv.AppendInt(b, int64(status), 10)
	return append(b, "}}"...)
}

// StatusName is Python's HTTPStatus(status).name: INTERNAL_SERVER_ERROR.
func StatusName(status int) string {
	t := http.StatusText(status)
	if t == "" {
		return strconv.Itoa(status)
	}
	return strings.ToUpper(strings.NewReplacer(" ", "_", "-", "_", "'", "").Replace(t))
}

// SGLangPrefillTransferFailed is the message SGLang's prefill aborts a
// request with when its KV transfer failed
// (disaggregation/prefill.py process_disagg_prefill_inflight_queue):
// f"Prefill transfer failed for request rank={tp_rank} {req.rid=}
// {req.bootstrap_room=}" plus " with exception {e}".
func SGLangPrefillTransferFailed(rank int, rid string, room uint64, exception string) string {
	return sglangPrefillTransferFailed + " rank=" + strconv.Itoa(rank) + " req.rid=" + pyRepr(rid) +
		" req.bootstrap_room=" + strconv.FormatUint(room, 10) + " with exception " + exception
}

// SGLangPrefillBootstrapFailed is the message SGLang's prefill aborts a
// request with when its decode never joined the room
// (disaggregation/prefill.py PrefillBootstrapQueue.pop_bootstrapped).
func SGLangPrefillBootstrapFailed(rank int, rid string, room uint64, exception string) string {
	return sglangPrefillBootstrapFailed + " rank=" + strconv.Itoa(rank) + " req.rid=" + pyRepr(rid) +
		" req.bootstrap_room=" + strconv.FormatUint(room, 10) + " with exception " + exception
}

// SGLangDecodeTransferFailed is the message SGLang's decode aborts a
// request with when its KV never arrived or failed
// (disaggregation/decode.py DecodeTransferQueue.pop_transferred).
func SGLangDecodeTransferFailed(rank int, rid string, room uint64, exception string) string {
	return sglangDecodeTransferFailed + " rank=" + strconv.Itoa(rank) + " decode_req.req.rid=" + pyRepr(rid) +
		" decode_req.req.bootstrap_room=" + strconv.FormatUint(room, 10) + " with exception " + exception
}

// pyRepr is Python's repr of a plain string.
func pyRepr(s string) string { return "'" + s + "'" }

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// SGLangServerInfo is the part of SGLang's GET /server_info
// (/get_server_info before it was renamed) that pdplane reads of an engine
// and answers as one itself: http_server.py server_info returns
// dataclasses.asdict(ServerArgs) merged with the scheduler's internal
// states, so the names are ServerArgs fields (server_args.py). A field an
// engine always sends and whose absence the reader must tell apart from
// zero is a pointer; what pdplane leaves out of its own answer (a field of
// one engine, not of a fleet) is omitted when zero.
type SGLangServerInfo struct {
	ModelPath       string `json:"model_path"`
	ServedModelName string `json:"served_model_name"`
	// DisaggregationMode is "prefill", "decode", or "null" for an engine
	// (or a router in front of several) that takes whole requests.
	DisaggregationMode          *string `json:"disaggregation_mode"`
	DisaggregationBootstrapPort int     `json:"disaggregation_bootstrap_port,omitempty"`
	PageSize                    *int    `json:"page_size,omitempty"`
	KVCacheDType                string  `json:"kv_cache_dtype,omitempty"`
	DType                       string  `json:"dtype,omitempty"`
	TPSize                      *int    `json:"tp_size,omitempty"`
	DPSize                      int     `json:"dp_size,omitempty"`
	PPSize                      int     `json:"pp_size,omitempty"`
	EnableDPAttention           bool    `json:"enable_dp_attention,omitempty"`
	IsEmbedding                 bool    `json:"is_embedding"`
}
