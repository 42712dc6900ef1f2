package pdproto

import (
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

// The payloads below are written by hand from the engines' sources, as the
// engines put them on the wire; each case names the function that writes it.

const memKindPrefill = `Prefill transfer failed for request rank=0 req.rid='a1b2' req.bootstrap_room=7 with exception Missing NIXL destination KV memory kind`

// checkFailure fails the test unless f is of class with status and, when
// message is set, carries it.
func checkFailure(t *testing.T, f Failure, class Class, status int, message string) {
	t.Helper()
	if f.Class != class || f.Status != status {
		t.Fatalf("got %v/%d, want %v/%d", f.Class, f.Status, class, status)
	}
	if message != "" && f.Message != message {
		t.Fatalf("message %q, want %q", f.Message, message)
	}
}

func TestClassifyAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		engine     registry.Engine
		leg        Leg
		status     int
		retryAfter bool
		body       string
		class      Class
		message    string
	}{
		{
			// sglang tokenizer_manager._handle_abort_finish_reason: a 500
			// abort, not streamed, raises fastapi.HTTPException(500,
			// message); http_server's HTTPException handler answers
			// ErrorResponse(object="error", message, type=str(500), code=500)
			// with ORJSONResponse.
			name: "sglang non-stream memory kind", engine: registry.EngineSGLang, leg: LegPrefill, status: 500,
			body:  `{"object":"error","message":"` + memKindPrefill + `","type":"500","param":null,"code":500}`,
			class: ClassMissingMemKind, message: memKindPrefill,
		},
		{
			// A body that is not JSON (a proxy, an older server) is its own
			// message.
			name: "plain text memory kind", engine: registry.EngineSGLang, leg: LegPrefill, status: 500,
			body: "RuntimeError: Missing NIXL destination KV memory kind", class: ClassMissingMemKind,
			message: "RuntimeError: Missing NIXL destination KV memory kind",
		},
		{
			// sglang disaggregation/prefill.py: any other transfer failure
			// aborts with the same prefix and the connector's exception.
			name: "sglang other transfer failure", engine: registry.EngineSGLang, leg: LegPrefill, status: 500,
			body:  `{"object":"error","message":"Prefill transfer failed for request rank=0 req.rid='x' req.bootstrap_room=9 with exception KVTransferError(bootstrap_room=9): Decode instance could be dead","type":"500","param":null,"code":500}`,
			class: ClassTransfer,
		},
		{
			// sglang disaggregation/decode.py pop_transferred: the decode's
			// own abort once its KV never came (waiting timeout).
			name: "sglang decode transfer failure", engine: registry.EngineSGLang, leg: LegDecode, status: 500,
			body:  `{"object":"error","message":"Decode transfer failed for request rank=0 decode_req.req.rid='x' decode_req.req.bootstrap_room=9 with exception NIXL KVReceiver Exception","type":"500","param":null,"code":500}`,
			class: ClassTransfer,
		},
		{
			name: "sglang generic 500", engine: registry.EngineSGLang, leg: LegDecode, status: 500,
			body: `{"object":"error","message":"Internal server error: CUDA error","type":"InternalServerError","param":null,"code":500}`, class: ClassEngine,
			message: "Internal server error: CUDA error",
		},
		{
			// sglang http_server._create_error_response: a ValueError is
			// 400 {"error": {"message": str(e)}}: the client's.
			name: "sglang value error", engine: registry.EngineSGLang, leg: LegPrefill, status: 400,
			body: `{"error":{"message":"The input (9000 tokens) is longer than the model's context length (8192 tokens)."}}`, class: ClassRefused,
			message: "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
		},
		{
			name: "overload 429", engine: registry.EngineSGLang, leg: LegDecode, status: 429, body: `{}`, class: ClassOverload,
		},
		{
			name: "overload 503 with Retry-After", engine: registry.EngineVLLM, leg: LegPrefill, status: 503, retryAfter: true, class: ClassOverload,
		},
		{
			name: "503 without Retry-After is the engine's", engine: registry.EngineSGLang, leg: LegPrefill, status: 503, class: ClassEngine,
		},
		{
			// vllm entrypoints/openai/engine/serving.py _raise_if_error: a
			// request that finished with an error (a KV load failed under
			// kv_load_failure_policy=fail) is GenerationError("Internal
			// server error"), ErrorResponse{"error": ErrorInfo}.
			name: "vllm decode kv load failure", engine: registry.EngineVLLM, leg: LegDecode, status: 500,
			body:  `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`,
			class: ClassTransfer, message: "Internal server error",
		},
		{
			// vLLM never raises SGLang's error: its text on a vLLM decode
			// is not the stale rule, whatever it says.
			name: "vllm never the memory-kind rule", engine: registry.EngineVLLM, leg: LegDecode, status: 500,
			body: `{"error":{"message":"RuntimeError: Missing NIXL destination KV memory kind","type":"InternalServerError","param":null,"code":500}}`, class: ClassTransfer,
		},
		{
			name: "vllm prefill 500 is the prefill's", engine: registry.EngineVLLM, leg: LegPrefill, status: 500,
			body: `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`, class: ClassEngine,
		},
		{
			name: "fastapi detail", engine: registry.EngineSGLang, leg: LegPrefill, status: 500,
			body: `{"detail":"Missing NIXL destination KV memory kind"}`, class: ClassMissingMemKind,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := ClassifyAnswer(tc.engine, tc.leg, tc.status, tc.retryAfter, []byte(tc.body))
			checkFailure(t, f, tc.class, tc.status, tc.message)
		})
	}
}

func TestClassifyEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		engine  registry.Engine
		leg     Leg
		data    string
		failure bool
		class   Class
		status  int
		message string
	}{
		{
			// sglang serving_chat._generate_chat_stream: an abort with an
			// HTTPStatus yields create_streaming_error_response(message,
			// code.name, code.value): json.dumps({"error": ErrorResponse}).
			name: "sglang openai stream error", engine: registry.EngineSGLang, leg: LegPrefill,
			data:    `{"error": {"object": "error", "message": "` + memKindPrefill + `", "type": "INTERNAL_SERVER_ERROR", "param": null, "code": 500}}`,
			failure: true, class: ClassMissingMemKind, status: 500, message: memKindPrefill,
		},
		{
			// sglang http_server.generate_request streams every output of
			// tokenizer_manager with orjson; _handle_abort_finish_reason
			// yields the aborted output itself when streaming.
			name: "sglang generate stream abort", engine: registry.EngineSGLang, leg: LegPrefill,
			data:    `{"text":"","output_ids":[],"meta_info":{"id":"a1b2","finish_reason":{"type":"abort","message":"` + memKindPrefill + `","status_code":500},"prompt_tokens":5,"completion_tokens":0,"cached_tokens":0}}`,
			failure: true, class: ClassMissingMemKind, status: 500, message: memKindPrefill,
		},
		{
			// http_server.generate_request: a ValueError while streaming is
			// {"error": {"message": str(e)}}, without a code.
			name: "sglang generate stream value error", engine: registry.EngineSGLang, leg: LegDecode,
			data: `{"error":{"message":"Decode transfer failed for request rank=0 decode_req.req.rid='x' decode_req.req.bootstrap_room=1 with exception boom"}}`, failure: true, class: ClassTransfer, status: 500,
		},
		{
			name: "sglang 503 abort is overload", engine: registry.EngineSGLang, leg: LegDecode,
			data: `{"text":"","meta_info":{"id":"x","finish_reason":{"type":"abort","message":"The request queue is full.","status_code":503}}}`, failure: true, class: ClassOverload, status: 503,
		},
		{
			name: "sglang 400 abort is refused", engine: registry.EngineSGLang, leg: LegDecode,
			data: `{"text":"","meta_info":{"id":"x","finish_reason":{"type":"abort","message":"too long","status_code":400}}}`, failure: true, class: ClassRefused, status: 400,
		},
		{
			// A graceful abort (no status_code: /abort_request) is an
			// ordinary finish for SGLang's OpenAI layer too.
			name: "graceful abort", engine: registry.EngineSGLang, leg: LegDecode,
			data: `{"text":"ab","meta_info":{"id":"x","finish_reason":{"type":"abort","message":"Abort before prefill"}}}`,
		},
		{
			name: "sglang generate normal finish", engine: registry.EngineSGLang, leg: LegDecode,
			data: `{"text":"hello","meta_info":{"id":"x","finish_reason":{"type":"length","length":2}}}`,
		},
		{
			// A successful answer may quote the message (an echoed prompt):
			// only structure counts.
			name: "quoted text is not a failure", engine: registry.EngineSGLang, leg: LegPrefill,
			data: `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"\"error\": Missing NIXL destination KV memory kind abort"},"finish_reason":null}]}`,
		},
		{
			name: "done", engine: registry.EngineSGLang, leg: LegDecode, data: `[DONE]`,
		},
		{
			// vllm create_streaming_error_response after _raise_if_error.
			name: "vllm stream kv load failure", engine: registry.EngineVLLM, leg: LegDecode,
			data:    `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`,
			failure: true, class: ClassTransfer, status: 500, message: "Internal server error",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, ok := ClassifyEvent(tc.engine, tc.leg, []byte(tc.data))
			if ok != tc.failure {
				t.Fatalf("failure %v, want %v (%+v)", ok, tc.failure, f)
			}
			if ok {
				checkFailure(t, f, tc.class, tc.status, tc.message)
			}
		})
	}
}

// TestProducersMatchTheEngines pins what the simulator emits against the
// same hand-written payloads, so that producing and recognising cannot
// drift apart.
func TestProducersMatchTheEngines(t *testing.T) {
	t.Parallel()
	msg := SGLangPrefillTransferFailed(0, "a1b2", 7, MissingMemKindMessage)
	if msg != memKindPrefill {
		t.Fatalf("prefill message %q, want %q", msg, memKindPrefill)
	}
	for _, tc := range []struct{ name, got, want string }{
		{"sglang body", string(SGLangErrorBody(500, "500", "m")), `{"object":"error","message":"m","type":"500","param":null,"code":500}`},
		{"sglang stream", string(SGLangStreamError(500, "m")), `{"error": {"object": "error", "message": "m", "type": "INTERNAL_SERVER_ERROR", "param": null, "code": 500}}`},
		{"vllm body", string(VLLMErrorBody(500, VLLMErrorTypeInternal, "", VLLMGenerationError)), `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`},
		{"vllm stream", string(VLLMStreamError(500, VLLMErrorTypeInternal, "", VLLMGenerationError)), `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`},
		{"decode message", SGLangDecodeTransferFailed(0, "r", 3, "e"), `Decode transfer failed for request rank=0 decode_req.req.rid='r' decode_req.req.bootstrap_room=3 with exception e`},
		{"status name", StatusName(503), "SERVICE_UNAVAILABLE"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
	if f, ok := ClassifyEvent(registry.EngineSGLang, LegPrefill, SGLangStreamError(500, msg)); !ok || f.Class != ClassMissingMemKind {
		t.Errorf("own stream error classified %+v %v", f, ok)
	}
	if !strings.Contains(string(SGLangErrorBody(500, "500", `quote " and \ `)), `quote \" and \\ `) {
		t.Error("messages are not escaped")
	}
}

func FuzzClassifyEvent(f *testing.F) {
	f.Add([]byte(`{"error": {"message": "x", "code": 500}}`))
	f.Add([]byte(`{"meta_info":{"finish_reason":{"type":"abort","status_code":500,"message":"m"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, ok := ClassifyEvent(registry.EngineSGLang, LegDecode, data)
		if ok && (fl.Class == ClassNone || fl.Status == 0 || len(fl.Message) > MessageLimit) {
			t.Fatalf("inconsistent failure %+v", fl)
		}
	})
}
