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
// FastAPI's JSONResponse (compact).
func VLLMErrorBody(status int, typ, message string) []byte {
	return appendVLLMError(nil, status, typ, message, ",", ":")
}

// VLLMStreamError is the payload of the error event vLLM sends after 200
// (create_streaming_error_response json.dumps the same ErrorResponse, with
// Python's ", " and ": ").
func VLLMStreamError(status int, typ, message string) []byte {
	return appendVLLMError(nil, status, typ, message, ", ", ": ")
}

func appendVLLMError(b []byte, status int, typ, message, comma, colon string) []byte {
	b = append(b, `{"error"`+colon+`{"message"`+colon...)
	b = appendJSONString(b, message)
	b = append(b, comma+`"type"`+colon...)
	b = appendJSONString(b, typ)
	b = append(b, comma+`"param"`+colon+`null`+comma+`"code"`+colon...)
	b = strconv.AppendInt(b, int64(status), 10)
	return append(b, "}}"...)
}
