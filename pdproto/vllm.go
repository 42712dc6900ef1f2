package pdproto

import "strconv"

// VLLMGenerationError is the message vLLM answers a request that finished
// with an error (finish_reason "error": RequestStatus.FINISHED_ERROR, which
// a KV load that failed under kv_load_failure_policy=fail produces):
// OpenAIServing._raise_if_error raises GenerationError("Internal server
// error"), status 500 (vllm/entrypoints/openai/engine/serving.py).
const VLLMGenerationError = "Internal server error"

// VLLMErrorTypeInternal is the error type vLLM gives a GenerationError
// (_convert_generation_error_to_response).
const VLLMErrorTypeInternal = "InternalServerError"

// VLLMErrorBody is the body of a non-streamed vLLM error: ErrorResponse
// with a nested ErrorInfo (vllm/entrypoints/openai/protocol.py), written by
// FastAPI's JSONResponse (compact). param names the request member at
// fault ("model" for an unknown model, "input_tokens" for a prompt over
// the context length), null when empty.
func VLLMErrorBody(status int, typ, param, message string) []byte {
	return appendVLLMError(nil, status, typ, param, message, ",", ":")
}

// VLLMStreamError is the payload of the error event vLLM sends after 200
// (create_streaming_error_response json.dumps the same ErrorResponse, with
// Python's ", " and ": ").
func VLLMStreamError(status int, typ, param, message string) []byte {
	return appendVLLMError(nil, status, typ, param, message, ", ", ": ")
}

func appendVLLMError(b []byte, status int, typ, param, message, comma, colon string) []byte {
	b = append(b, `{"error"`+colon+`{"message"`+colon...)
	b = appendJSONString(b, message)
	b = append(b, comma+`"type"`+colon...)
	b = appendJSONString(b, typ)
	b = append(b, comma+`"param"`+colon...)
	if param == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, param)
	}
	b = append(b, comma+`"code"`+colon...)
	b = strconv.AppendInt(b, int64(status), 10)
	return append(b, "}}"...)
}

// KVTransferParams is vLLM's NixlConnector hand-off, in both directions: the
// router asks a prefill for do_remote_decode; the prefill answers with where
// its blocks are (NixlPullScheduler.request_finished in
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py, and
// the output processor's remote_prefill_cached_tokens); the decode gets
// that answer with its request. As vLLM 0.32 answers it
// (sim/testdata/vllm/prefill-completion.json).
type KVTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	// RemoteBlockIDs are the prefill's blocks, one list per KV cache group
	// (one group for a model with one attention type).
	RemoteBlockIDs [][]int `json:"remote_block_ids"`
	RemoteHost     *string `json:"remote_host"`
	RemotePort     *int    `json:"remote_port"`
	// RemoteRequestID names the prefill's held blocks; the decode's READ
	// notifies it so that the prefill frees them.
	RemoteRequestID string `json:"remote_request_id,omitempty"`
	TPSize          int    `json:"tp_size,omitempty"`
	DCPSize         int    `json:"dcp_size,omitempty"`
	PPSize          int    `json:"pp_size,omitempty"`
	// RemoteNumTokens is how many prompt tokens the blocks hold.
	RemoteNumTokens int `json:"remote_num_tokens,omitempty"`
	// RemoteBlocksExpiryTime is set by a decode that pins blocks for a
	// read-back; null from a prefill.
	RemoteBlocksExpiryTime *float64 `json:"remote_blocks_expiry_time"`
	// TransferMode is "pull" (the decode READs) or "push".
	TransferMode              string `json:"transfer_mode,omitempty"`
	RemotePrefillCachedTokens *int   `json:"remote_prefill_cached_tokens,omitempty"`
}

// VLLMPrefillKVTransferParams is the member a prefill's body gets so that it
// keeps its KV for a remote decode, as vLLM's own proxy writes it
// (toy_proxy_server.py send_request_to_service).
const VLLMPrefillKVTransferParams = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
