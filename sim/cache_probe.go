package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// The simulator's cache probe: what a router's oracle would know of an
// engine if it could see inside it.

// readBody reads a request body of at most maxBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *httpError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &httpError{status: http.StatusRequestEntityTooLarge, msg: "request body too large", typ: "BadRequestError"}
		}
		return nil, errCancelled
	}
	return body, nil
}

// CacheProbe is the answer of POST /_sim/cache_probe: what a prefill
// would do with a request now. A routing benchmark's oracle probes every
// prefill and picks the one with the least QueuedComputeTokens +
// PromptTokens − CachedTokens.
type CacheProbe struct {
	// PromptTokens is the request's prompt tokens (all its prompts').
	PromptTokens int `json:"prompt_tokens"`
	// CachedTokens is how many of them the prefix cache holds now (0 on a
	// decode): the prompt's leading cached blocks, short of the block of
	// its last token.
	CachedTokens int `json:"cached_tokens"`
	// QueuedRequests is the prompts waiting for their turn at the compute
	// (Config.PrefillSlots).
	QueuedRequests int `json:"queued_requests"`
	// QueuedComputeTokens is the tokens the prompts waiting or computing
	// have to compute: their prompts less what the cache held for them.
	QueuedComputeTokens int64 `json:"queued_compute_tokens"`
}

// handleCacheProbe is POST /_sim/cache_probe: the body of a generation
// request (chat when it has messages, SGLang's /generate when it has text
// or input_ids, else a completion), answered with a CacheProbe. It changes
// nothing: the cache's recency and counters stay as they were.
func (s *Sim) handleCacheProbe(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e != nil {
		if e != errCancelled {
			writeProblem(w, problem{Type: "https://pdplane.dev/problems/malformed-request", Title: "Malformed request", Status: e.status, Detail: e.msg})
		}
		return
	}
	var shape struct {
		Messages json.RawMessage `json:"messages"`
		Text     json.RawMessage `json:"text"`
		InputIDs json.RawMessage `json:"input_ids"`
	}
	_ = json.Unmarshal(body, &shape) // parseRequest says what is wrong
	rt := routeCompletions
	switch {
	case shape.Messages != nil:
		rt = routeChat
	case shape.Text != nil || shape.InputIDs != nil:
		rt = routeGenerate
	}
	q, err := parseRequest(rt, body, &s.cfg)
	if err != nil {
		p := problem{Type: "https://pdplane.dev/problems/malformed-request", Title: "Malformed request", Status: http.StatusBadRequest, Detail: err.Error()}
		var br *badRequest
		if errors.As(err, &br) {
			p.Field = br.field
		}
		writeProblem(w, p)
		return
	}
	var out CacheProbe
	for _, p := range q.prompts {
		out.PromptTokens += len(p)
		if s.cache != nil {
			out.CachedTokens += s.cache.peek(p)
		}
	}
	qs := s.computeQ.state()
	out.QueuedRequests, out.QueuedComputeTokens = qs.waiting, qs.tokens
	writeJSON(w, out)
}
