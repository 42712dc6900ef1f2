package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// seq is one prompt's generation: n deterministic tokens after the prompt.
type seq struct {
	prompt []int
	seed   uint64 // prefix hash of the whole prompt
	n      int
	finish string // "length" or "stop"
	// inputLogprobs: the prefill reports the prompt's logprobs; a decode
	// reports none of its own (the router puts the prefill's in front).
	inputLogprobs bool
}

func newSeq(prompt []int, seeds []uint64, n int, finish string) seq {
	return seq{prompt: prompt, seed: seeds[len(seeds)-1], n: n, finish: finish}
}

// text returns the text of tokens [0, k).
func (s seq) text(k int) string {
	var sb strings.Builder
	for i := range k {
		_, t, _ := outputToken(s.seed, i)
		sb.WriteString(t)
	}
	return sb.String()
}

func (s seq) ids(k int) []int {
	out := make([]int, k)
	for i := range k {
		out[i], _, _ = outputToken(s.seed, i)
	}
	return out
}

// answer is what a generation request is answered with.
type answer struct {
	id      string
	model   string
	created int64
	seqs    []seq
	kv      *pdproto.KVTransferParams // vLLM prefill only
	vllm    bool                      // written in vLLM's shapes (vllm_answer.go)
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (a *answer) usage() *usage {
	var u usage
	for _, s := range a.seqs {
		u.PromptTokens += len(s.prompt)
		u.CompletionTokens += s.n
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return &u
}

type chatMessageOut struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type choice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *chatMessageOut `json:"delta,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type openAIAnswer struct {
	ID               string                    `json:"id"`
	Object           string                    `json:"object"`
	Created          int64                     `json:"created"`
	Model            string                    `json:"model"`
	Choices          []choice                  `json:"choices"`
	Usage            *usage                    `json:"usage,omitempty"`
	KVTransferParams *pdproto.KVTransferParams `json:"kv_transfer_params,omitempty"`
}

// tokenLogprob is SGLang's [logprob, token_id, null] triple; the first
// prompt token has no logprob.
type tokenLogprob struct {
	lp    float64
	hasLP bool
	id    int
}

func (t tokenLogprob) MarshalJSON() ([]byte, error) {
	b := []byte{'['}
	if t.hasLP {
		b = strconv.AppendFloat(b, t.lp, 'g', -1, 64)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(t.id), 10)
	return append(b, ",null]"...), nil
}

type metaInfo struct {
	ID                  string                `json:"id"`
	FinishReason        *pdproto.FinishReason `json:"finish_reason"`
	PromptTokens        int                   `json:"prompt_tokens"`
	CompletionTokens    int                   `json:"completion_tokens"`
	CachedTokens        int                   `json:"cached_tokens"`
	InputTokenLogprobs  *[]tokenLogprob       `json:"input_token_logprobs,omitempty"`
	OutputTokenLogprobs *[]tokenLogprob       `json:"output_token_logprobs,omitempty"`
}

type generateAnswer struct {
	Text      string   `json:"text"`
	OutputIDs []int    `json:"output_ids"`
	MetaInfo  metaInfo `json:"meta_info"`
	Index     *int     `json:"index,omitempty"`
}

// generateObject renders seq i after k tokens; done marks the last.
func (a *answer) generateObject(q *genRequest, i, k int, done bool) generateAnswer {
	s := a.seqs[i]
	g := generateAnswer{
		Text:      s.text(k),
		OutputIDs: s.ids(k),
		MetaInfo: metaInfo{
			ID:               a.id,
			PromptTokens:     len(s.prompt),
			CompletionTokens: k,
		},
	}
	if q.batch {
		g.Index = &i
	}
	if done {
		if s.finish == "length" {
			g.MetaInfo.FinishReason = &pdproto.FinishReason{Type: pdproto.FinishLength, Length: k}
		} else {
			g.MetaInfo.FinishReason = &pdproto.FinishReason{Type: pdproto.FinishStop}
		}
	}
	if q.logprob {
		in := []tokenLogprob{}
		if s.inputLogprobs {
			for j, tok := range s.prompt {
				in = append(in, tokenLogprob{id: tok, lp: inputLogprob(tok), hasLP: j > 0})
			}
		}
		out := make([]tokenLogprob, k)
		for j := range k {
			id, _, lp := outputToken(s.seed, j)
			out[j] = tokenLogprob{id: id, lp: lp, hasLP: true}
		}
		g.MetaInfo.InputTokenLogprobs, g.MetaInfo.OutputTokenLogprobs = &in, &out
	}
	return g
}

func strp(s string) *string { return &s }

// write writes a non-streamed answer.
func (a *answer) write(w http.ResponseWriter, q *genRequest) {
	var v any
	switch {
	case a.vllm:
		v = a.vllmObject(q)
	case q.route == routeGenerate:
		if q.batch {
			l := make([]generateAnswer, len(a.seqs))
			for i, s := range a.seqs {
				l[i] = a.generateObject(q, i, s.n, true)
			}
			v = l
		} else {
			v = a.generateObject(q, 0, a.seqs[0].n, true)
		}
	case q.route == routeChat:
		s := a.seqs[0]
		v = openAIAnswer{
			ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
			Choices: []choice{{Message: &chatMessageOut{Role: "assistant", Content: strp(s.text(s.n))}, FinishReason: strp(s.finish)}},
			Usage:   a.usage(), KVTransferParams: a.kv,
		}
	default:
		o := openAIAnswer{ID: a.id, Object: "text_completion", Created: a.created, Model: a.model, Usage: a.usage(), KVTransferParams: a.kv}
		for i, s := range a.seqs {
			o.Choices = append(o.Choices, choice{Index: i, Text: strp(q.echoText(i) + s.text(s.n)), FinishReason: strp(s.finish)})
		}
		v = o
	}
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode answer", "InternalServerError")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// stream writes the answer as SSE, one event per token per sequence
// (sequences of a batch step together), pausing pause(k) before token k
// (Sim.tokenPause); it stops early, returning false, when ctx ends or the
// client goes away.
func (a *answer) stream(ctx context.Context, w http.ResponseWriter, q *genRequest, pause func(k int) time.Duration) bool {
	if !q.streaming {
		startStream(w)
		q.streaming = true
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 512)
	event := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		buf = pdproto.AppendEvent(buf[:0], b)
		if _, err := w.Write(buf); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if a.vllm && q.route == routeChat {
		for i := range a.seqs {
			if !event(a.vllmRoleChunk(i)) {
				return false
			}
		}
	}
	for k := range a.longest() {
		if d := pause(k); d > 0 && !sleepCtx(ctx, d) {
			return false
		}
		if ctx.Err() != nil {
			return false
		}
		for i, s := range a.seqs {
			if k >= s.n {
				continue
			}
			if !event(a.chunk(q, i, k, k == s.n-1)) {
				return false
			}
		}
	}
	if q.includeUsage && q.route != routeGenerate {
		object := "text_completion"
		if q.route == routeChat {
			object = "chat.completion.chunk"
		}
		if !event(openAIAnswer{ID: a.id, Object: object, Created: a.created, Model: a.model, Choices: []choice{}, Usage: a.usage()}) {
			return false
		}
	}
	if _, err := io.WriteString(w, pdproto.Done); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// longest is the number of tokens of the longest sequence.
func (a *answer) longest() int {
	n := 0
	for _, s := range a.seqs {
		n = max(n, s.n)
	}
	return n
}

// chunk renders token k of sequence i as one streamed event.
func (a *answer) chunk(q *genRequest, i, k int, last bool) any {
	s := a.seqs[i]
	var finish *string
	if last {
		finish = strp(s.finish)
	}
	if a.vllm {
		return a.vllmChunk(q, i, k, last)
	}
	_, tok, _ := outputToken(s.seed, k)
	switch q.route {
	case routeGenerate:
		// SGLang streams the text so far in every event.
		return a.generateObject(q, i, k+1, last)
	case routeChat:
		d := &chatMessageOut{Content: strp(tok)}
		if k == 0 {
			d.Role = "assistant"
		}
		return openAIAnswer{ID: a.id, Object: "chat.completion.chunk", Created: a.created, Model: a.model,
			Choices: []choice{{Index: i, Delta: d, FinishReason: finish}}, KVTransferParams: a.kv}
	default:
		if k == 0 {
			// The echo goes with the first chunk (SGLang's
			// _generate_completion_stream, is_first_chunk).
			tok = q.echoText(i) + tok
		}
		return openAIAnswer{ID: a.id, Object: "text_completion", Created: a.created, Model: a.model,
			Choices: []choice{{Index: i, Text: strp(tok), FinishReason: finish}}, KVTransferParams: a.kv}
	}
}

// echoText is the prompt text that starts answer i's text: empty unless
// the request asked for echo.
func (q *genRequest) echoText(i int) string {
	if i < len(q.echo) {
		return q.echo[i]
	}
	return ""
}

// startStream sends a streamed answer's 200 and SSE headers and flushes
// them, before any event. The media type is the engines': both answer
// streams with Starlette's StreamingResponse(media_type="text/event-stream"),
// whose Response.init_headers appends "; charset=utf-8" to a text/* type.
func startStream(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", sseContentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
}

// writeFailure answers a failed generation request in the form the engine
// uses for its route and stream mode (the formats are pdproto's):
//
//   - a streamed request whose 200 and headers are out (q.streaming), or
//     one the engine aborted once it was running (e.abort; SGLang's OpenAI
//     routes send the 200 with the first chunk, here the error): SGLang's
//     error event (OpenAI routes) or abort event (/generate), or vLLM's
//     error event, then [DONE] — the status is in the event;
//   - anything else: the status with SGLang's flat ErrorResponse or
//     vLLM's nested one.
func (s *Sim) writeFailure(w http.ResponseWriter, q *genRequest, e *httpError) {
	vllm := s.cfg.Engine == registry.EngineVLLM
	typ := e.typ
	if e.abort && !vllm {
		// HTTPException(status, message) through http_server's handler:
		// type str(status).
		typ = strconv.Itoa(e.status)
	}
	if q == nil || !q.streaming && !(q.stream && e.abort) {
		b := pdproto.SGLangErrorBody(e.status, typ, e.msg)
		if vllm {
			b = pdproto.VLLMErrorBody(e.status, typ, e.param, e.msg)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.status)
		_, _ = w.Write(b)
		return
	}
	var data []byte
	switch {
	case vllm:
		data = pdproto.VLLMStreamError(e.status, typ, e.param, e.msg)
	case q.route == routeGenerate:
		g := generateAnswer{OutputIDs: []int{}, MetaInfo: metaInfo{
			ID: q.rid, FinishReason: pdproto.AbortFinish(e.status, e.msg), PromptTokens: len(q.prompts[0]),
		}}
		if q.batch {
			g.Index = new(int)
		}
		data, _ = json.Marshal(g)
	default:
		data = pdproto.SGLangStreamError(e.status, e.msg)
	}
	if !q.streaming {
		startStream(w)
	}
	_, _ = w.Write(append(pdproto.AppendEvent(nil, data), pdproto.Done...))
	_ = http.NewResponseController(w).Flush()
}

// engineError is the body SGLang and vLLM answer errors with.
type engineError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// writeError answers an engine error.
func writeError(w http.ResponseWriter, status int, msg, typ string) {
	var e engineError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, status
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeJSON answers 200 with v.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode answer", "InternalServerError")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// sleepCtx sleeps d or until ctx ends, and reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// sseContentType is a streamed answer's Content-Type as SGLang and vLLM
// send it (startStream).
const sseContentType = "text/event-stream; charset=utf-8"
