package sim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestSGLangFailureFormats: with the missing-mem-kind fault on the decode,
// the prefill answers each route and stream mode the way SGLang does, and
// the decode, never told, waits out its timeout and aborts in the same
// form. The expected payloads are written from SGLang's sources:
//
//   - not streamed: tokenizer_manager._handle_abort_finish_reason raises
//     HTTPException(500, message); http_server's handler answers 500
//     {"object":"error","message":...,"type":"500","param":null,"code":500};
//   - OpenAI routes streamed: 200, then serving_chat._generate_chat_stream
//     (serving_completions likewise) yields
//     create_streaming_error_response(message, "INTERNAL_SERVER_ERROR", 500),
//     json.dumps of {"error": ErrorResponse}, then data: [DONE];
//   - /generate streamed: 200, then http_server.generate_request yields the
//     aborted output itself (orjson) with meta_info.finish_reason
//     {"type":"abort","message":...,"status_code":500}, then data: [DONE].
func TestSGLangFailureFormats(t *testing.T) {
	t.Parallel()
	// Long enough that a loaded machine still gets the decode into the room
	// before the prefill gives up on it (it once did not, at 300 ms).
	const wait = time.Second
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.RoomTimeout = wait })
	if err := d.SetFault(sim.FaultMissingMemKind); err != nil {
		t.Fatal(err)
	}
	const prefillPrefix = "Prefill transfer failed for request rank=0 req.rid='"
	const memKind = " with exception Missing NIXL destination KV memory kind"
	const decodePrefix = "Decode transfer failed for request rank=0 decode_req.req.rid='"
	c := simtest.NewClient()
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		stream     bool
		generate   bool
	}{
		{"chat", "/v1/chat/completions", chatBody("formats", 2, false), false, false},
		{"chat stream", "/v1/chat/completions", chatBody("formats", 2, true), true, false},
		{"completions stream", "/v1/completions", map[string]any{"prompt": "formats", "max_tokens": 2, "stream": true}, true, false},
		{"generate", "/generate", map[string]any{"text": "formats", "sampling_params": map[string]any{"max_new_tokens": 2}}, false, true},
		{"generate stream", "/generate", map[string]any{"text": "formats", "sampling_params": map[string]any{"max_new_tokens": 2}, "stream": true}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			pr, dr, err := c.SGLang(context.Background(), p, d, tc.path, tc.body, simtest.Room())
			if err != nil {
				t.Fatal(err)
			}
			if time.Since(start) < wait {
				t.Fatalf("the decode answered after %s, before its %s timeout", time.Since(start), wait)
			}
			for _, leg := range []struct {
				name   string
				r      simtest.Response
				prefix string
				suffix string
			}{{"prefill", pr, prefillPrefix, memKind}, {"decode", dr, decodePrefix, ""}} {
				msg := failureMessage(t, leg.name, leg.r, tc.stream, tc.generate)
				if !strings.HasPrefix(msg, leg.prefix) || !strings.HasSuffix(msg, leg.suffix) {
					t.Errorf("%s message %q", leg.name, msg)
				}
			}
		})
	}
}

// failureMessage checks the form of one failed answer and returns its
// message.
func failureMessage(t *testing.T, leg string, r simtest.Response, stream, generate bool) string {
	t.Helper()
	if !stream {
		var e struct {
			Object  string  `json:"object"`
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		}
		if r.Status != http.StatusInternalServerError || json.Unmarshal(r.Body, &e) != nil || e.Object != "error" || e.Type != "500" || e.Code != 500 {
			t.Fatalf("%s: %d %s", leg, r.Status, r.Body)
		}
		return e.Message
	}
	events, done := simtest.Events(r.Body)
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream") || len(events) != 1 || !done {
		t.Fatalf("%s: %d %v %s", leg, r.Status, r.Header, r.Body)
	}
	if generate {
		var g struct {
			Text     string `json:"text"`
			MetaInfo struct {
				ID           string `json:"id"`
				FinishReason struct {
					Type       string `json:"type"`
					Message    string `json:"message"`
					StatusCode int    `json:"status_code"`
				} `json:"finish_reason"`
			} `json:"meta_info"`
		}
		if json.Unmarshal(events[0], &g) != nil || g.MetaInfo.FinishReason.Type != "abort" || g.MetaInfo.FinishReason.StatusCode != 500 || g.MetaInfo.ID == "" {
			t.Fatalf("%s: abort event %s", leg, events[0])
		}
		return g.MetaInfo.FinishReason.Message
	}
	if !strings.HasPrefix(string(events[0]), `{"error": {"object": "error", "message": `) ||
		!strings.HasSuffix(string(events[0]), `, "type": "INTERNAL_SERVER_ERROR", "param": null, "code": 500}}`) {
		t.Fatalf("%s: error event %s", leg, events[0])
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(events[0], &e); err != nil {
		t.Fatalf("%s: %v", leg, err)
	}
	return e.Error.Message
}

// TestVLLMFailureFormats: with the fault, a vLLM decode answers as vLLM
// does when a KV load fails under kv_load_failure_policy=fail
// (entrypoints/openai/engine/serving.py _raise_if_error: "Internal server
// error", 500; streamed, 200 then create_streaming_error_response's event):
// never SGLang's words.
func TestVLLMFailureFormats(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineVLLM, nil)
	if err := d.SetFault(sim.FaultMissingMemKind); err != nil {
		t.Fatal(err)
	}
	c := simtest.NewClient()
	_, dr, err := c.VLLM(context.Background(), p, d, "/v1/completions", map[string]any{"prompt": "formats", "max_tokens": 2})
	if err != nil || dr.Status != http.StatusInternalServerError ||
		string(dr.Body) != `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}` {
		t.Fatalf("not streamed: %v %d %s", err, dr.Status, dr.Body)
	}
	_, dr, err = c.VLLM(context.Background(), p, d, "/v1/chat/completions", chatBody("formats", 2, true))
	events, done := simtest.Events(dr.Body)
	if err != nil || dr.Status != http.StatusOK || !done || len(events) != 1 ||
		string(events[0]) != `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` {
		t.Fatalf("streamed: %v %d %s", err, dr.Status, dr.Body)
	}
}
