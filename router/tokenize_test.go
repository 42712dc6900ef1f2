package router

import (
	"errors"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

// TestTokenizeCall pins the tokenize requests the precise policy sends:
// vLLM's POST /tokenize takes a chat's messages with the members that
// change its rendering (vllm/entrypoints/openai/protocol.py,
// TokenizeChatRequest) or a completion's prompt (TokenizeCompletionRequest);
// SGLang's POST /v1/tokenize takes a prompt only (serving_tokenize.py), so an
// SGLang chat is not tokenized, nor is a batch anywhere.
func TestTokenizeCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		route  route
		engine registry.Engine
		body   string
		path   string
		want   string
	}{
		{"vllm chat", routeChat, registry.EngineVLLM,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"add_generation_prompt":false,"tools":[]}`,
			"/tokenize", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"tools":[]}`},
		{"vllm completion", routeCompletions, registry.EngineVLLM, `{"model":"m","prompt":"a b c","max_tokens":3}`,
			"/tokenize", `{"model":"m","prompt":"a b c"}`},
		{"sglang completion", routeCompletions, registry.EngineSGLang, `{"model":"m","prompt":"a b c","add_special_tokens":false}`,
			"/v1/tokenize", `{"model":"m","prompt":"a b c","add_special_tokens":false}`},
		{"sglang generate text", routeGenerate, registry.EngineSGLang, `{"model":"m","text":"a b c"}`,
			"/v1/tokenize", `{"model":"m","prompt":"a b c"}`},
		{"sglang chat", routeChat, registry.EngineSGLang, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "", ""},
		{"batch", routeCompletions, registry.EngineVLLM, `{"model":"m","prompt":["a","b"]}`, "", ""},
		{"token prompt", routeCompletions, registry.EngineVLLM, `{"model":"m","prompt":[1,2,3]}`, "", ""},
	} {
		q, aerr := parseRequest(tc.route, []byte(tc.body), 512)
		if aerr != nil {
			t.Fatalf("%s: %v", tc.name, aerr.Message)
		}
		path, body, err := tokenizeCall(q, tc.engine)
		if tc.path == "" {
			if !errors.Is(err, errNoTokenizer) {
				t.Errorf("%s: %s %s, %v; want errNoTokenizer", tc.name, path, body, err)
			}
			continue
		}
		if err != nil || path != tc.path || string(body) != tc.want {
			t.Errorf("%s: %s %s, %v\nwant %s %s", tc.name, path, body, err, tc.path, tc.want)
		}
	}
}
