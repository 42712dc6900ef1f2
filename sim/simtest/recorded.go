package simtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The answers of a real engine, recorded by the real-engine suite
// (realengine, `go test ./realengine -update`) into sim/testdata/vllm and
// held against the simulator's answers to the same requests by sim's
// TestRecordedVLLMAnswers: field names and JSON types, status codes,
// media types and SSE framing. A difference between the two fails a test
// instead of hiding in the router's assumptions.

// RecordedVLLMVersion is the vLLM release whose answers sim/testdata/vllm
// holds.
const RecordedVLLMVersion = "0.32.0"

// ModelPlaceholder stands for the served model's name in a Case's body.
const ModelPlaceholder = "$MODEL"

// Case is one request whose answer is recorded.
type Case struct {
	Name   string         `json:"name"`
	Role   string         `json:"role"` // the engine asked: "prefill" or "decode"
	Method string         `json:"method"`
	Path   string         `json:"path"`
	Body   map[string]any `json:"body,omitempty"`
	// ViaPrefill sends Body to the prefill first as vLLM's prefill leg
	// (VLLMPrefillBody) and Body with the prefill's kv_transfer_params to
	// the decode, whose answer is recorded: the decode leg of a PD request.
	ViaPrefill bool `json:"via_prefill,omitempty"`
	// Metrics names the Prometheus families of a /metrics answer whose
	// type and label names are recorded: the ones pdplane reads.
	Metrics []string `json:"metrics,omitempty"`
}

// Recorded is one recorded answer.
type Recorded struct {
	VLLMVersion string `json:"vllm_version"`
	Case        Case   `json:"case"`
	Status      int    `json:"status"`
	MediaType   string `json:"media_type"`
	// Body is a JSON answer as the engine sent it; Events the data of each
	// SSE event, and Done whether the stream ended with [DONE].
	Body   json.RawMessage   `json:"body,omitempty"`
	Events []json.RawMessage `json:"events,omitempty"`
	Done   bool              `json:"done,omitempty"`
	// Families maps each family of Case.Metrics to its type and sorted
	// label names ("gauge engine,model_name").
	Families map[string]string `json:"families,omitempty"`
	// Text is any other body (empty for /health).
	Text string `json:"text,omitempty"`
}

// VLLMCases are the requests whose answers pdplane reads from a vLLM
// engine: what the agent reads to register and probe it, the prefill's
// hand-off, unary and streamed answers of both routes, and the errors.
func VLLMCases() []Case {
	chat := func(stream bool, maxTokens int) map[string]any {
		return map[string]any{"model": ModelPlaceholder, "messages": []any{map[string]any{"role": "user", "content": "hello world the router"}},
			"max_tokens": maxTokens, "temperature": 0, "stream": stream}
	}
	completion := func(stream bool, prompt string) map[string]any {
		return map[string]any{"model": ModelPlaceholder, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream}
	}
	long := strings.Repeat("hello world ", 600)
	return []Case{
		{Name: "models", Role: "prefill", Method: http.MethodGet, Path: "/v1/models"},
		{Name: "version", Role: "prefill", Method: http.MethodGet, Path: "/version"},
		{Name: "health", Role: "decode", Method: http.MethodGet, Path: "/health"},
		{Name: "metrics", Role: "decode", Method: http.MethodGet, Path: "/metrics", Metrics: []string{
			"vllm:cache_config_info", "process_start_time_seconds",
			"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
			"vllm:prompt_tokens_by_source", "vllm:request_success", "vllm:nixl_num_failed_transfers",
		}},
		{Name: "prefill-completion", Role: "prefill", Method: http.MethodPost, Path: "/v1/completions",
			Body: VLLMPrefillBody(completion(false, "the prefill engine sends the decode a block"))},
		{Name: "prefill-chat", Role: "prefill", Method: http.MethodPost, Path: "/v1/chat/completions",
			Body: VLLMPrefillBody(chat(false, 4))},
		{Name: "decode-completion", Role: "decode", Method: http.MethodPost, Path: "/v1/completions",
			Body: completion(false, "the prefill engine sends the decode a block"), ViaPrefill: true},
		{Name: "decode-chat", Role: "decode", Method: http.MethodPost, Path: "/v1/chat/completions",
			Body: chat(false, 4), ViaPrefill: true},
		{Name: "decode-chat-stream", Role: "decode", Method: http.MethodPost, Path: "/v1/chat/completions",
			Body: chat(true, 4), ViaPrefill: true},
		{Name: "decode-completion-stream", Role: "decode", Method: http.MethodPost, Path: "/v1/completions",
			Body: completion(true, "the prefill engine sends the decode a block"), ViaPrefill: true},
		{Name: "error-unknown-model", Role: "prefill", Method: http.MethodPost, Path: "/v1/chat/completions",
			Body: map[string]any{"model": "no-such-model", "messages": []any{map[string]any{"role": "user", "content": "hi"}}}},
		{Name: "error-prompt-too-long", Role: "prefill", Method: http.MethodPost, Path: "/v1/completions",
			Body: completion(false, long)},
		{Name: "error-prompt-too-long-stream", Role: "prefill", Method: http.MethodPost, Path: "/v1/completions",
			Body: completion(true, long)},
	}
}

// withModel returns body with ModelPlaceholder replaced by model.
func withModel(body map[string]any, model string) map[string]any {
	if body == nil {
		return nil
	}
	m := clone(body)
	if m["model"] == ModelPlaceholder {
		m["model"] = model
	}
	return m
}

// RecordCase sends c to the engines (prefill and decode base URLs) serving
// model and records the answer.
func (cl *Client) RecordCase(ctx context.Context, c Case, prefill, decode, model string) (Recorded, error) {
	url := prefill
	if c.Role == "decode" {
		url = decode
	}
	body := withModel(c.Body, model)
	h := http.Header{"X-Request-Id": {"recorded-" + c.Name}}
	if c.ViaPrefill {
		p, err := cl.Post(ctx, prefill, c.Path, VLLMPrefillBody(body), h)
		if err != nil {
			return Recorded{}, fmt.Errorf("%s: prefill: %w", c.Name, err)
		}
		if p.Status != http.StatusOK {
			return Recorded{}, fmt.Errorf("%s: prefill answered %d: %s", c.Name, p.Status, p.Body)
		}
		if body, err = VLLMDecodeBody(body, p); err != nil {
			return Recorded{}, fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	var r Response
	var err error
	if c.Method == http.MethodGet {
		r, err = cl.Get(ctx, url+c.Path)
	} else {
		r, err = cl.Post(ctx, url, c.Path, body, h)
	}
	if err != nil {
		return Recorded{}, fmt.Errorf("%s: %w", c.Name, err)
	}
	return record(c, r)
}

// Get reads url to the end.
func (cl *Client) Get(ctx context.Context, url string) (Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Response{}, err
	}
	return cl.do(req)
}

func record(c Case, r Response) (Recorded, error) {
	rec := Recorded{VLLMVersion: RecordedVLLMVersion, Case: c, Status: r.Status}
	rec.MediaType, _, _ = mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case len(c.Metrics) > 0:
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(bytes.NewReader(r.Body))
		if err != nil {
			return rec, fmt.Errorf("%s: %w", c.Name, err)
		}
		rec.Families = map[string]string{}
		for _, name := range c.Metrics {
			f, ok := fams[name]
			if !ok {
				// The text format names a counter's family without _total.
				f, ok = fams[name+"_total"]
			}
			if !ok {
				rec.Families[name] = "absent"
				continue
			}
			labels := map[string]bool{}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = true
				}
			}
			names := make([]string, 0, len(labels))
			for n := range labels {
				names = append(names, n)
			}
			sort.Strings(names)
			rec.Families[name] = strings.ToLower(f.GetType().String()) + " " + strings.Join(names, ",")
		}
	case rec.MediaType == "text/event-stream":
		events, done := Events(r.Body)
		for _, e := range events {
			rec.Events = append(rec.Events, json.RawMessage(e))
		}
		rec.Done = done
	case rec.MediaType == "application/json":
		if !json.Valid(r.Body) {
			return rec, fmt.Errorf("%s: %s answered invalid JSON: %s", c.Name, rec.MediaType, r.Body)
		}
		rec.Body = json.RawMessage(bytes.TrimSpace(r.Body))
	default:
		rec.Text = string(r.Body)
	}
	return rec, nil
}

// RecordedDir is sim/testdata/vllm, from a package folder of the module.
func RecordedDir() string { return filepath.Join("..", "sim", "testdata", "vllm") }

// WriteRecorded writes rec to dir/<case>.json.
func WriteRecorded(dir string, rec Recorded) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, rec.Case.Name+".json"), append(b, '\n'), 0o644)
}

// ReadRecorded reads dir/<name>.json.
func ReadRecorded(dir, name string) (Recorded, error) {
	var rec Recorded
	b, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		return rec, err
	}
	return rec, json.Unmarshal(b, &rec)
}

// ShapeDiff lists how got's answer differs in shape from want's: status,
// media type, SSE framing, the metric families' types and labels, and the
// JSON field names and types of the body or of the stream's first, second
// and last events. A field that want has as null may be anything in got
// (the engine leaves it unset for this request); every other field must
// be in both, with one JSON type. Values are not compared.
func ShapeDiff(want, got Recorded) []string {
	var d []string
	if want.Status != got.Status {
		d = append(d, fmt.Sprintf("status %d, want %d", got.Status, want.Status))
	}
	if want.MediaType != got.MediaType {
		d = append(d, fmt.Sprintf("media type %q, want %q", got.MediaType, want.MediaType))
	}
	if want.Done != got.Done {
		d = append(d, fmt.Sprintf("stream ends with [DONE]: %v, want %v", got.Done, want.Done))
	}
	for name, w := range want.Families {
		if g := got.Families[name]; !familyFits(w, g) {
			d = append(d, fmt.Sprintf("metric %s: %q, want %q (the same type, and no label the engine does not send)", name, g, w))
		}
	}
	if (len(want.Body) == 0) != (len(got.Body) == 0) {
		d = append(d, fmt.Sprintf("JSON body: %d bytes, want %d", len(got.Body), len(want.Body)))
	} else if len(want.Body) > 0 {
		d = append(d, jsonDiff("body", want.Body, got.Body)...)
	}
	if (len(want.Events) == 0) != (len(got.Events) == 0) {
		d = append(d, fmt.Sprintf("%d events, want some: %v", len(got.Events), len(want.Events) > 0))
	} else if len(want.Events) > 0 {
		at := func(ev []json.RawMessage, i int) json.RawMessage {
			if i < 0 {
				i = len(ev) + i
			}
			return ev[min(max(i, 0), len(ev)-1)]
		}
		for _, i := range []int{0, 1, -1} {
			d = append(d, jsonDiff(fmt.Sprintf("event[%d]", i), at(want.Events, i), at(got.Events, i))...)
		}
	}
	if want.Text != "" || got.Text != "" {
		if (want.Text == "") != (got.Text == "") {
			d = append(d, fmt.Sprintf("text body %q, want %q", got.Text, want.Text))
		}
	}
	return d
}

// familyFits reports whether a metric family recorded as got ("type
// label,label") fits the engine's want: the same type, present when the
// engine's is, and no label the engine does not send (vLLM's info gauges
// carry dozens of labels; a simulator carries the ones anyone reads).
func familyFits(want, got string) bool {
	wt, wl, _ := strings.Cut(want, " ")
	gt, gl, _ := strings.Cut(got, " ")
	if wt != gt {
		return false
	}
	have := strings.Split(wl, ",")
	for _, l := range strings.Split(gl, ",") {
		if l != "" && !slices.Contains(have, l) {
			return false
		}
	}
	return true
}

func jsonDiff(path string, want, got json.RawMessage) []string {
	var w, g any
	if err := json.Unmarshal(want, &w); err != nil {
		return []string{path + ": recorded answer is not JSON: " + err.Error()}
	}
	if err := json.Unmarshal(got, &g); err != nil {
		return []string{path + ": not JSON: " + err.Error()}
	}
	var d []string
	shapeDiff(path, w, g, &d)
	return d
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return fmt.Sprintf("%T", v)
}

func shapeDiff(path string, want, got any, d *[]string) {
	if want == nil {
		return
	}
	if kind(want) != kind(got) {
		*d = append(*d, fmt.Sprintf("%s: %s, want %s", path, kind(got), kind(want)))
		return
	}
	switch w := want.(type) {
	case map[string]any:
		g := got.(map[string]any)
		keys := make([]string, 0, len(w)+len(g))
		for k := range w {
			keys = append(keys, k)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			wv, inW := w[k]
			gv, inG := g[k]
			switch {
			case !inG:
				*d = append(*d, fmt.Sprintf("%s.%s: missing", path, k))
			case !inW:
				*d = append(*d, fmt.Sprintf("%s.%s: not in the engine's answer", path, k))
			default:
				shapeDiff(path+"."+k, wv, gv, d)
			}
		}
	case []any:
		g := got.([]any)
		if len(w) > 0 && len(g) > 0 {
			shapeDiff(path+"[0]", w[0], g[0], d)
		}
	}
}
