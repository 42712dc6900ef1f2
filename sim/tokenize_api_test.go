package sim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim/simtest"
)

// cachedFor is what the cache holds of a prompt of n tokens in blocks of 4
// once it was computed: its full blocks short of the one of its last token.
func cachedFor(n int) int { return (n - 1) / 4 * 4 }

var chatMessages = []any{
	map[string]any{"role": "system", "content": "you answer briefly and with care"},
	map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "what does a router read of the engines caches"}}},
}

// TestVLLMTokenize pins vLLM's POST /tokenize
// (vllm/entrypoints/serve/tokenize/protocol.py TokenizeCompletionRequest,
// TokenizeChatRequest and TokenizeResponse; serving.py create_tokenize,
// which checks the model as a generation does): {count, max_model_len,
// tokens, token_strs}. Its tokens are the prompt the same text or messages
// are computed as: a router that keys blocks by them finds what the cache
// holds after the completion.
func TestVLLMTokenize(t *testing.T) {
	t.Parallel()
	p := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineVLLM))
	for _, tt := range []struct {
		name     string
		tokenize map[string]any
		path     string
		generate map[string]any
	}{
		{"prompt", map[string]any{"model": "sim-model", "prompt": "a prompt the router tokenizes before it routes"},
			"/v1/completions", map[string]any{"model": "sim-model", "prompt": "a prompt the router tokenizes before it routes", "max_tokens": 1}},
		{"messages", map[string]any{"messages": chatMessages, "add_generation_prompt": true},
			"/v1/chat/completions", map[string]any{"model": "sim-model", "messages": chatMessages, "max_tokens": 1}},
	} {
		r := postOK(t, p, "/tokenize", tt.tokenize)
		var got map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &got); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range got {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"count", "max_model_len", "token_strs", "tokens"}) || string(got["token_strs"]) != "null" ||
			string(got["max_model_len"]) != "256" {
			t.Fatalf("%s: /tokenize answered %s", tt.name, r.Body)
		}
		var tokens []int
		var count int
		if json.Unmarshal(got["tokens"], &tokens) != nil || json.Unmarshal(got["count"], &count) != nil || count != len(tokens) || count < 9 {
			t.Fatalf("%s: /tokenize answered %s", tt.name, r.Body)
		}
		if pr := probe(t, p, map[string]any{"prompt": tokens}); pr.PromptTokens != count || pr.CachedTokens != 0 {
			t.Fatalf("%s: before the completion the probe reads %+v", tt.name, pr)
		}
		a := decodeAnswer(t, postOK(t, p, tt.path, tt.generate))
		if a.Usage == nil || a.Usage.PromptTokens != count {
			t.Errorf("%s: the completion's usage %+v, want %d prompt tokens", tt.name, a.Usage, count)
		}
		if pr := probe(t, p, map[string]any{"prompt": tokens}); pr.CachedTokens != cachedFor(count) {
			t.Errorf("%s: the completion cached %d of the tokenized prompt's tokens, want %d", tt.name, pr.CachedTokens, cachedFor(count))
		}
		if pr := probe(t, p, tt.generate); pr.PromptTokens != count || pr.CachedTokens != cachedFor(count) {
			t.Errorf("%s: probing the completion's own body: %+v", tt.name, pr)
		}
	}

	c := simtest.NewClient()
	for _, tt := range []struct {
		name   string
		body   map[string]any
		status int
	}{
		{"another model", map[string]any{"model": "other", "prompt": "x"}, http.StatusNotFound},
		{"token ids", map[string]any{"prompt": []int{1, 2, 3}}, http.StatusBadRequest},
		{"nothing", map[string]any{"model": "sim-model"}, http.StatusBadRequest},
		// TokenizeChatRequest.check_generation_prompt.
		{"continue and generation prompt", map[string]any{"messages": chatMessages, "continue_final_message": true}, http.StatusBadRequest},
	} {
		r, err := c.Post(context.Background(), p.URL(), "/tokenize", tt.body, nil)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct {
				Message string `json:"message"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if r.Status != tt.status || json.Unmarshal(r.Body, &e) != nil || e.Error.Code != tt.status || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want %d in vLLM's error body", tt.name, r.Status, r.Body, tt.status)
		}
	}
}

// TestSGLangTokenize pins SGLang's POST /v1/tokenize and /tokenize
// (python/sglang/srt/entrypoints/http_server.py openai_v1_tokenize serves
// both; entrypoints/openai/protocol.py TokenizeRequest and
// TokenizeResponse; serving_tokenize.py): {tokens, count, max_model_len},
// lists of each for a list of prompts; exactly one of prompt and messages.
// The tokens are the prompt the prefill computes for the same body.
func TestSGLangTokenize(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	text := "a prompt the router tokenizes before it routes"
	for _, path := range []string{"/v1/tokenize", "/tokenize"} {
		var one struct {
			Tokens      []int `json:"tokens"`
			Count       int   `json:"count"`
			MaxModelLen int   `json:"max_model_len"`
		}
		if err := json.Unmarshal(postOK(t, p, path, map[string]any{"model": "sim-model", "prompt": text}).Body, &one); err != nil {
			t.Fatal(err)
		}
		if one.Count != len(one.Tokens) || one.Count < 9 || one.MaxModelLen != 256 {
			t.Fatalf("%s: %+v", path, one)
		}
		var list struct {
			Tokens [][]int `json:"tokens"`
			Count  []int   `json:"count"`
		}
		if err := json.Unmarshal(postOK(t, p, path, map[string]any{"prompt": []string{text, "another"}}).Body, &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Tokens) != 2 || !slices.Equal(list.Tokens[0], one.Tokens) || !slices.Equal(list.Count, []int{one.Count, len(list.Tokens[1])}) {
			t.Fatalf("%s: a list of prompts: %+v", path, list)
		}
	}
	c := simtest.NewClient()
	for _, tt := range []struct {
		name     string
		tokenize map[string]any
		path     string
		generate map[string]any
	}{
		{"prompt", map[string]any{"prompt": text}, "/generate",
			map[string]any{"text": text, "sampling_params": map[string]any{"max_new_tokens": 1}}},
		{"messages", map[string]any{"messages": chatMessages}, "/v1/chat/completions",
			map[string]any{"model": "sim-model", "messages": chatMessages, "max_tokens": 1}},
	} {
		var tok struct {
			Tokens []int `json:"tokens"`
		}
		if err := json.Unmarshal(postOK(t, p, "/v1/tokenize", tt.tokenize).Body, &tok); err != nil {
			t.Fatal(err)
		}
		pr, dr, err := c.SGLang(context.Background(), p, d, tt.path, tt.generate, simtest.Room())
		if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
			t.Fatalf("%s: %v, prefill %d %s, decode %d %s", tt.name, err, pr.Status, pr.Body, dr.Status, dr.Body)
		}
		if got := probe(t, p, map[string]any{"input_ids": tok.Tokens}); got.PromptTokens != len(tok.Tokens) || got.CachedTokens != cachedFor(len(tok.Tokens)) {
			t.Errorf("%s: the prefill cached %+v of the tokenized prompt, want %d of %d", tt.name, got, cachedFor(len(tok.Tokens)), len(tok.Tokens))
		}
	}
	for _, body := range []map[string]any{{"model": "sim-model"}, {"prompt": "x", "messages": chatMessages}, {"prompt": 7}} {
		r, err := c.Post(context.Background(), p.URL(), "/v1/tokenize", body, nil)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		}
		if r.Status != http.StatusBadRequest || json.Unmarshal(r.Body, &e) != nil || e.Code != http.StatusBadRequest || e.Message == "" {
			t.Errorf("%v: %d %s, want 400 in SGLang's error body", body, r.Status, r.Body)
		}
	}
}
