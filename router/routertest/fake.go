package routertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// Behavior tells a fake engine how to answer. The zero value answers every
// request correctly, streaming three chunks without pauses.
type Behavior struct {
	// Status, when not 0, answers with this status and Body (and Retry-After
	// when set) instead of generating.
	Status     int
	Body       string
	RetryAfter string
	// Delay waits this long before answering (cut short by cancellation).
	Delay time.Duration
	// Hang never answers: the handler waits until its request is cancelled.
	Hang bool
	// HangAfterHeaders sends 200 and its headers, then waits for cancellation.
	HangAfterHeaders bool
	// Chunks is how many chunks a decode streams (3 when 0); ChunkPause is
	// the pause before each chunk after the first.
	Chunks     int
	ChunkPause time.Duration
	// BeforeChunk, when set, runs before chunk i (from 0) is written; it may
	// block, to hold the stream at a point the test controls.
	BeforeChunk func(i int)
	// BreakAfter, when > 0, cuts the connection after that many chunks,
	// without ending the stream.
	BreakAfter int
	// StreamError, when set, answers 200 with one SSE error event carrying
	// this message, then [DONE]: the way SGLang's OpenAI routes and vLLM
	// report a failure after they sent headers (pdproto's formats).
	StreamError string
}

// Request is one request a fake received.
type Request struct {
	Path   string
	Header http.Header
	Body   []byte
	JSON   map[string]any // the body decoded with json.Number for numbers
}

// Fake is what FakeSGLang and FakeVLLM share: a real HTTP server on
// 127.0.0.1 that records requests and cancellations and follows a Behavior.
type Fake struct {
	*httptest.Server
	Name   string
	Role   registry.Role
	Engine registry.Engine
	// Model is what answers carry when the request names none.
	Model string
	// InputLogprobs is the raw JSON list this engine answers as
	// meta_info.input_token_logprobs when asked for logprobs.
	InputLogprobs string

	mu        sync.Mutex
	behavior  Behavior
	queue     []Behavior
	requests  []Request
	started   atomic.Int64
	cancelled atomic.Int64
	cancelCh  chan string
	startCh   chan string

	serve func(f *Fake, w http.ResponseWriter, r *http.Request, req *Request, b Behavior)
}

func newFake(name string, role registry.Role, engine registry.Engine,
	serve func(*Fake, http.ResponseWriter, *http.Request, *Request, Behavior)) *Fake {
	f := &Fake{
		Name: name, Role: role, Engine: engine, Model: "test-model",
		cancelCh: make(chan string, 256),
		startCh:  make(chan string, 256),
		serve:    serve,
	}
	if role == registry.RolePrefill {
		f.InputLogprobs = `[[-0.5,1,null],[-0.25,2,null]]`
	} else {
		f.InputLogprobs = `[[-0.125,3,null]]`
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.handle))
	return f
}

// Close shuts the fake down, first cutting open connections so that
// handlers left waiting (Hang) end.
func (f *Fake) Close() {
	f.Server.CloseClientConnections()
	f.Server.Close()
}

// SetBehavior changes how the fake answers from now on.
func (f *Fake) SetBehavior(b Behavior) {
	f.mu.Lock()
	f.behavior = b
	f.mu.Unlock()
}

// Queue makes the next len(bs) requests follow bs in order, then the
// behavior set by SetBehavior again.
func (f *Fake) Queue(bs ...Behavior) {
	f.mu.Lock()
	f.queue = append(f.queue, bs...)
	f.mu.Unlock()
}

// Requests returns every request received so far.
func (f *Fake) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

// Started counts requests the fake began to handle.
func (f *Fake) Started() int { return int(f.started.Load()) }

// Cancelled counts requests whose context ended before the fake finished
// answering them: the router gave up on the leg.
func (f *Fake) Cancelled() int { return int(f.cancelled.Load()) }

// WaitCancelled waits until a request of the fake is cancelled, failing the
// test after timeout.
func (f *Fake) WaitCancelled(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-f.cancelCh:
	case <-time.After(timeout):
		t.Fatalf("%s: no request cancelled within %v", f.Name, timeout)
	}
}

// WaitStarted waits until the fake starts handling a request.
func (f *Fake) WaitStarted(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-f.startCh:
	case <-time.After(timeout):
		t.Fatalf("%s: no request started within %v", f.Name, timeout)
	}
}

// Peer returns the fake as a ready registry peer of model at generation 1.
func (f *Fake) Peer(model string) registry.Peer {
	return ReadyPeer(Spec(f.Name, f.Role, f.Engine, f.URL, model), 1)
}

func (f *Fake) next() Behavior {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.queue) > 0 {
		b := f.queue[0]
		f.queue = f.queue[1:]
		return b
	}
	return f.behavior
}

func (f *Fake) handle(w http.ResponseWriter, r *http.Request) {
	f.started.Add(1)
	select {
	case f.startCh <- r.URL.Path:
	default:
	}
	body, _ := io.ReadAll(r.Body)
	req := Request{Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	if len(body) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			writeError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
			return
		}
		req.JSON = m
	}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()

	b := f.next()
	defer func() {
		if r.Context().Err() != nil {
			f.cancelled.Add(1)
			select {
			case f.cancelCh <- r.URL.Path:
			default:
			}
		}
	}()
	if b.Hang {
		<-r.Context().Done()
		return
	}
	if b.Delay > 0 && !sleepCtx(r.Context(), b.Delay) {
		return
	}
	if b.Status != 0 {
		if b.RetryAfter != "" {
			w.Header().Set("Retry-After", b.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(b.Status)
		_, _ = io.WriteString(w, b.Body)
		return
	}
	if b.HangAfterHeaders {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	if b.StreamError != "" {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		data := pdproto.SGLangStreamError(http.StatusInternalServerError, b.StreamError)
		if f.Engine == registry.EngineVLLM {
			data = pdproto.VLLMStreamError(http.StatusInternalServerError, pdproto.VLLMErrorTypeInternal, b.StreamError)
		}
		_, _ = w.Write(append(pdproto.AppendEvent(nil, data), pdproto.Done...))
		return
	}
	f.serve(f, w, r, &req, b)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": status}})
	_, _ = w.Write(b)
}

// chunkWriter streams SSE events, honouring the behavior's pauses, hooks and
// breaks; it returns false when the stream must stop.
type chunkWriter struct {
	w  http.ResponseWriter
	r  *http.Request
	b  Behavior
	fl http.Flusher
}

func (c *chunkWriter) start() {
	c.w.Header().Set("Content-Type", "text/event-stream")
	c.w.Header().Set("Cache-Control", "no-cache")
	c.w.WriteHeader(http.StatusOK)
	c.fl = c.w.(http.Flusher)
}

func (c *chunkWriter) chunk(i int, payload []byte) bool {
	if c.b.BreakAfter > 0 && i >= c.b.BreakAfter {
		panic(http.ErrAbortHandler) // cut the connection mid-stream
	}
	if i > 0 && c.b.ChunkPause > 0 && !sleepCtx(c.r.Context(), c.b.ChunkPause) {
		return false
	}
	if c.b.BeforeChunk != nil {
		c.b.BeforeChunk(i)
	}
	if c.r.Context().Err() != nil {
		return false
	}
	if _, err := fmt.Fprintf(c.w, "data: %s\n\n", payload); err != nil {
		return false
	}
	c.fl.Flush()
	return true
}

func (c *chunkWriter) done() {
	_, _ = io.WriteString(c.w, "data: [DONE]\n\n")
	c.fl.Flush()
}

func (b Behavior) chunks() int {
	if b.Chunks > 0 {
		return b.Chunks
	}
	return 3
}

// modelOf is the model a request names, or the fake's.
func (f *Fake) modelOf(req *Request) string {
	if m, ok := req.JSON["model"].(string); ok && m != "" {
		return m
	}
	return f.Model
}

func isTrue(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case []any:
		for _, e := range x {
			if isTrue(e) {
				return true
			}
		}
	}
	return false
}

func intOf(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n.String())
	return i, err == nil
}

// batchOf mirrors SGLang: a list of strings or of lists is a batch.
func batchOf(v any) int {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return 0
	}
	switch l[0].(type) {
	case string, []any:
		return len(l)
	}
	return 0
}

// chatChunk and the other answer builders render OpenAI-shaped answers.
func chatChunk(id, model string, i, last int, content string) []byte {
	delta := map[string]any{"content": content}
	if i == 0 {
		delta["role"] = "assistant"
	}
	var finish any
	if i == last {
		finish = "stop"
	}
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}},
	})
	return b
}

func chatCompletion(id, model, content string, extra map[string]any) []byte {
	m := map[string]any{
		"id": id, "object": "chat.completion", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": content}, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
	}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

func completionChunk(id, model string, i, last int, text string) []byte {
	var finish any
	if i == last {
		finish = "stop"
	}
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "text_completion", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": finish}},
	})
	return b
}

func completion(id, model, text string, extra map[string]any) []byte {
	m := map[string]any{
		"id": id, "object": "text_completion", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
	}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

// tokens is the text a fake generates: "tok0 tok1 ...".
func tokens(name string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = name + "-tok" + strconv.Itoa(i) + " "
	}
	return out
}

func writeJSONBody(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

func requestID(req *Request) string {
	if id := req.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	return "none"
}

// routeOf names the OpenAI route of a path, or "" for others.
func routeOf(path string) string {
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return "chat"
	case strings.HasSuffix(path, "/v1/completions"):
		return "completions"
	case strings.HasSuffix(path, "/generate"):
		return "generate"
	}
	return ""
}
