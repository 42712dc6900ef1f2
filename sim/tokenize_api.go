package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// The engines' tokenize endpoints, which a router asks for a request's
// tokens (to key the blocks it expects in an engine's prefix cache). The
// tokens are the simulator's own: what its generation routes take as the
// prompt of the same text or messages (tokenize, chatPrompt).

// vllmTokenizeRequest is vLLM's TokenizeRequest, the union of
// TokenizeCompletionRequest (prompt) and TokenizeChatRequest (messages)
// (vllm/entrypoints/serve/tokenize/protocol.py, vLLM 0.32). The members
// that only shape a real tokenizer's output (add_special_tokens,
// chat_template, ...) change nothing here: the simulator's prompt always
// starts with its BOS token, as its generation routes' do.
type vllmTokenizeRequest struct {
	Model                *string         `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             []rawMessage    `json:"messages"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
}

// vllmTokenizeResponse is vLLM's TokenizeResponse. token_strs is null: the
// simulator's tokens have no strings (return_token_strs is not served).
type vllmTokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []int     `json:"tokens"`
	TokenStrs   []*string `json:"token_strs"`
}

// handleVLLMTokenize is vLLM's POST /tokenize
// (vllm/entrypoints/serve/tokenize/api_router.py, serving.py
// create_tokenize): the model checked as a generation's is, then a prompt
// tokenized as /v1/completions takes it, or messages rendered as
// /v1/chat/completions renders them.
func (s *Sim) handleVLLMTokenize(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e != nil {
		s.writeTokenizeError(w, r, e)
		return
	}
	var req vllmTokenizeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		s.writeTokenizeError(w, r, badRequestErr(badf("", "invalid JSON body: %v", err)))
		return
	}
	if req.Model != nil && *req.Model != s.cfg.Model {
		s.writeTokenizeError(w, r, &httpError{status: http.StatusNotFound, typ: "NotFoundError", param: "model",
			msg: fmt.Sprintf("The model `%s` does not exist. Valid aliases: %s.", *req.Model, s.cfg.Model)})
		return
	}
	var tokens []int
	var err error
	switch hasPrompt := len(req.Prompt) > 0 && string(req.Prompt) != "null"; {
	case hasPrompt:
		// TokenizeCompletionRequest.prompt is a string.
		var text string
		if json.Unmarshal(req.Prompt, &text) != nil {
			s.writeTokenizeError(w, r, badRequestErr(badf("prompt", "must be a string")))
			return
		}
		tokens = tokenize(text)
	case req.Messages != nil:
		// TokenizeChatRequest.check_generation_prompt.
		if req.ContinueFinalMessage && (req.AddGenerationPrompt == nil || *req.AddGenerationPrompt) {
			s.writeTokenizeError(w, r, badRequestErr(badf("continue_final_message", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")))
			return
		}
		tokens, err = chatPrompt(req.Messages)
	default:
		err = badf("prompt", "prompt or messages is required")
	}
	if err != nil {
		s.writeTokenizeError(w, r, badRequestErr(err))
		return
	}
	writeJSON(w, vllmTokenizeResponse{Count: len(tokens), MaxModelLen: s.maxModelLen(), Tokens: tokens})
}

// sglangTokenizeRequest is SGLang's TokenizeRequest
// (python/sglang/srt/entrypoints/openai/protocol.py): a prompt, or a list
// of them, or (newer SGLang) messages; exactly one of the two.
type sglangTokenizeRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []rawMessage    `json:"messages"`
}

// handleSGLangTokenize is SGLang's POST /v1/tokenize and /tokenize
// (entrypoints/http_server.py openai_v1_tokenize,
// entrypoints/openai/serving_tokenize.py OpenAIServingTokenize): tokens and
// count of one prompt, or a list of each for a list of prompts, and
// max_model_len. SGLang does not check the model.
func (s *Sim) handleSGLangTokenize(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e != nil {
		s.writeTokenizeError(w, r, e)
		return
	}
	var req sglangTokenizeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		s.writeTokenizeError(w, r, badRequestErr(badf("", "invalid JSON body: %v", err)))
		return
	}
	hasPrompt := len(req.Prompt) > 0 && string(req.Prompt) != "null"
	if hasPrompt == (req.Messages != nil) {
		s.writeTokenizeError(w, r, badRequestErr(badf("prompt", "Exactly one of 'prompt' or 'messages' must be provided.")))
		return
	}
	out := map[string]any{"max_model_len": s.maxModelLen()}
	if !hasPrompt {
		tokens, err := chatPrompt(req.Messages)
		if err != nil {
			s.writeTokenizeError(w, r, badRequestErr(err))
			return
		}
		out["tokens"], out["count"] = tokens, len(tokens)
		writeJSON(w, out)
		return
	}
	if p := bytes.TrimSpace(req.Prompt); len(p) > 0 && p[0] == '[' {
		var texts []string
		if err := json.Unmarshal(p, &texts); err != nil {
			s.writeTokenizeError(w, r, badRequestErr(badf("prompt", "must be a string or a list of strings")))
			return
		}
		lists, counts := make([][]int, len(texts)), make([]int, len(texts))
		for i, t := range texts {
			lists[i] = tokenize(t)
			counts[i] = len(lists[i])
		}
		out["tokens"], out["count"] = lists, counts
		writeJSON(w, out)
		return
	}
	var text string
	if err := json.Unmarshal(req.Prompt, &text); err != nil {
		s.writeTokenizeError(w, r, badRequestErr(badf("prompt", "must be a string or a list of strings")))
		return
	}
	tokens := tokenize(text)
	out["tokens"], out["count"] = tokens, len(tokens)
	writeJSON(w, out)
}

// writeTokenizeError answers a tokenize request's failure in the engine's
// error format, unless the client is gone.
func (s *Sim) writeTokenizeError(w http.ResponseWriter, r *http.Request, e *httpError) {
	if e == errCancelled || r.Context().Err() != nil {
		return
	}
	s.writeFailure(w, nil, e)
}
