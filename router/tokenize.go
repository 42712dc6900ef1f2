package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// The precise policy matches a request's prompt against the blocks each
// engine's KV events say it holds, and those blocks are token IDs: the
// router needs the prompt's tokens exactly as the engine will compute them,
// chat template included. It asks an engine of the model, which tokenizes
// with the model's own tokenizer and template:
//
//   - vLLM serves POST /tokenize, for a completion's prompt or a chat's
//     messages (vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest,
//     TokenizeChatRequest; the answer's "tokens");
//   - SGLang serves POST /v1/tokenize for prompts only (serving_tokenize.py):
//     an SGLang chat request is not tokenized, and is routed by the ring.
//
// An SGLang /generate request that gives input_ids needs no engine.

// maxTokenizeAnswer bounds an engine's tokenize answer: about 2 M tokens
// of JSON, past any context window served today.
const maxTokenizeAnswer = 16 << 20

// tokenizeTimeout bounds one tokenize call. A request waits for it before
// its pick, so it is short: an engine that does not answer in time leaves
// the request to the ring, not waiting.
const tokenizeTimeout = 2 * time.Second

// errNoTokenizer says the request's prompt cannot be tokenized by an engine
// of this protocol (an SGLang chat, a batch): not a failure.
var errNoTokenizer = errors.New("no tokenize endpoint for this request")

// chatTokenizeMembers are the members of a chat request that change how
// vLLM renders it (TokenizeChatRequest's fields): copied as they are.
var chatTokenizeMembers = []string{"messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
	"chat_template", "chat_template_kwargs", "tools", "mm_processor_kwargs"}

// tokenizeCall is the tokenize request for q to an engine of protocol e: the
// path and the body; errNoTokenizer when there is none.
func tokenizeCall(q *request, e registry.Engine) (path string, body []byte, err error) {
	if q.batch > 0 {
		return "", nil, errNoTokenizer
	}
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	b.WriteString(strconv.Quote(q.model))
	add := func(key string, v []byte) {
		b.WriteString(`,"`)
		b.WriteString(key)
		b.WriteString(`":`)
		b.Write(v)
	}
	switch {
	case q.route == routeChat && e == registry.EngineVLLM:
		for _, k := range chatTokenizeMembers {
			if m := find(q.members, k); m != nil {
				add(k, m.value(q.body))
			}
		}
	case q.route == routeCompletions || q.route == routeGenerate:
		key := "prompt"
		if q.route == routeGenerate {
			key = "text"
		}
		m := find(q.members, key)
		if m == nil || m.value(q.body)[0] != '"' {
			return "", nil, errNoTokenizer
		}
		add("prompt", m.value(q.body))
		if m := find(q.members, "add_special_tokens"); m != nil {
			add("add_special_tokens", m.value(q.body))
		}
	default:
		return "", nil, errNoTokenizer
	}
	b.WriteByte('}')
	if e == registry.EngineVLLM {
		return "/tokenize", b.Bytes(), nil
	}
	return "/v1/tokenize", b.Bytes(), nil
}

// givenTokenIDs is the JSON of the token IDs q gives as its one prompt (a
// /generate's input_ids, a completion's list of IDs); nil when it gives
// text.
func givenTokenIDs(q *request) []byte {
	key := "prompt"
	switch {
	case q.batch > 0 || q.route == routeChat:
		return nil
	case q.route == routeGenerate:
		key = "input_ids"
	}
	if m := find(q.members, key); m != nil && m.value(q.body)[0] == '[' {
		return m.value(q.body)
	}
	return nil
}

// promptTokens returns the token IDs of q's prompt: read from the body when
// it gives them, else asked of the engine at baseURL.
func (rt *Router) promptTokens(ctx context.Context, q *request, baseURL string, e registry.Engine) ([]int32, error) {
	if v := givenTokenIDs(q); v != nil {
		var ids []int32
		if err := json.Unmarshal(v, &ids); err != nil {
			return nil, fmt.Errorf("the prompt's token IDs: %w", err)
		}
		return ids, nil
	}
	path, body, err := tokenizeCall(q, e)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(baseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if rt.upstreamAuth != "" {
		req.Header.Set("Authorization", rt.upstreamAuth)
	}
	resp, err := rt.transport.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", baseURL, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeAnswer+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("tokenize at %s: read the answer: %w", baseURL, err)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("tokenize at %s: status %d", baseURL, resp.StatusCode)
	case len(raw) > maxTokenizeAnswer:
		return nil, fmt.Errorf("tokenize at %s: answer over %d bytes", baseURL, maxTokenizeAnswer)
	}
	var ans struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", baseURL, err)
	}
	return ans.Tokens, nil
}
