package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		route     route
		body      string
		status    int // 0: accepted
		code      string
		model     string
		stream    bool
		batch, n  int
		bootstrap int
		logprob   bool
	}{
		{name: "chat", route: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, model: "m", stream: true, n: 1},
		{name: "chat n", route: routeChat, body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":3}`, model: "m", n: 3, bootstrap: 3},
		{name: "chat without model", route: routeChat, body: `{"messages":[{"role":"user","content":"hi"}]}`, n: 1},
		{name: "chat null model", route: routeChat, body: `{"model":null,"messages":[{"role":"user","content":"hi"}]}`, n: 1},
		{name: "chat missing messages", route: routeChat, body: `{"model":"m"}`, status: 400, code: "missing_required_parameter"},
		{name: "chat empty messages", route: routeChat, body: `{"model":"m","messages":[]}`, status: 400, code: "invalid_value"},
		{name: "chat messages not array", route: routeChat, body: `{"model":"m","messages":"hi"}`, status: 400, code: "invalid_type"},
		{name: "malformed", route: routeChat, body: `{"model":"m","messages":[}`, status: 400, code: "invalid_json"},
		{name: "not object", route: routeChat, body: `[1]`, status: 400, code: "invalid_request_body"},
		{name: "model not string", route: routeChat, body: `{"model":1,"messages":[1]}`, status: 400, code: "invalid_type"},
		{name: "stream not bool", route: routeChat, body: `{"model":"m","messages":[1],"stream":"yes"}`, status: 400, code: "invalid_type"},
		{name: "n zero", route: routeChat, body: `{"model":"m","messages":[1],"n":0}`, status: 400, code: "invalid_value"},
		{name: "completion string", route: routeCompletions, body: `{"model":"m","prompt":"once"}`, model: "m", n: 1},
		{name: "completion batch", route: routeCompletions, body: `{"model":"m","prompt":["a","b"],"n":2}`, model: "m", batch: 2, n: 2, bootstrap: 4},
		{name: "completion tokens", route: routeCompletions, body: `{"model":"m","prompt":[1,2,3]}`, model: "m", n: 1},
		{name: "completion token batch", route: routeCompletions, body: `{"model":"m","prompt":[[1,2],[3]]}`, model: "m", batch: 2, n: 1, bootstrap: 2},
		{name: "completion missing prompt", route: routeCompletions, body: `{"model":"m"}`, status: 400, code: "missing_required_parameter"},
		{name: "completion mixed", route: routeCompletions, body: `{"model":"m","prompt":["a",[1]]}`, status: 400, code: "invalid_type"},
		{name: "generate text", route: routeGenerate, body: `{"text":"hi","sampling_params":{"max_new_tokens":8}}`, n: 1},
		{name: "generate batch", route: routeGenerate, body: `{"text":["a","b","c"]}`, batch: 3, n: 1, bootstrap: 3},
		{name: "generate ids", route: routeGenerate, body: `{"input_ids":[1,2,3]}`, n: 1},
		{name: "generate id batch n", route: routeGenerate, body: `{"input_ids":[[1],[2]],"sampling_params":{"n":3}}`, batch: 2, n: 3, bootstrap: 6},
		{name: "generate n", route: routeGenerate, body: `{"text":"a","sampling_params":{"n":2}}`, n: 2, bootstrap: 2},
		{name: "generate logprob", route: routeGenerate, body: `{"text":"a","return_logprob":true}`, n: 1, logprob: true},
		{name: "generate logprob list", route: routeGenerate, body: `{"text":["a","b"],"return_logprob":[false,true]}`, batch: 2, n: 1, bootstrap: 2, logprob: true},
		{name: "generate missing input", route: routeGenerate, body: `{"sampling_params":{}}`, status: 400, code: "missing_required_parameter"},
		{name: "generate both inputs", route: routeGenerate, body: `{"text":"a","input_ids":[1]}`, status: 400, code: "invalid_value"},
		{name: "generate text of numbers", route: routeGenerate, body: `{"text":[1,2]}`, status: 400, code: "invalid_type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q, e := parseRequest(tt.route, []byte(tt.body), 512)
			if tt.status != 0 {
				if e == nil {
					t.Fatalf("accepted, want %d %s", tt.status, tt.code)
				}
				if e.Status != tt.status || e.Code != tt.code {
					t.Fatalf("got %d %s (%s), want %d %s", e.Status, e.Code, e.Message, tt.status, tt.code)
				}
				return
			}
			if e != nil {
				t.Fatalf("refused: %d %s %s", e.Status, e.Code, e.Message)
			}
			if q.model != tt.model || q.stream != tt.stream || q.batch != tt.batch || q.n != tt.n ||
				q.bootstrapCount() != tt.bootstrap || q.logprob != tt.logprob {
				t.Fatalf("got model=%q stream=%t batch=%d n=%d bootstrap=%d logprob=%t", q.model, q.stream, q.batch, q.n, q.bootstrapCount(), q.logprob)
			}
		})
	}
}

func TestAPIErrorFormat(t *testing.T) {
	t.Parallel()
	e := badRequest(`say "hi"`, "messages", "missing_required_parameter")
	var got struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(e.appendJSON(nil), &got); err != nil {
		t.Fatal(err)
	}
	if got.Error.Message != `say "hi"` || got.Error.Type != "invalid_request_error" || got.Error.Code != "missing_required_parameter" ||
		got.Error.Param == nil || *got.Error.Param != "messages" {
		t.Fatalf("got %+v", got.Error)
	}
	if e.Status != http.StatusBadRequest {
		t.Fatalf("status %d", e.Status)
	}
}

func mustParse(t *testing.T, rt route, body string) *request {
	t.Helper()
	q, e := parseRequest(rt, []byte(body), 512)
	if e != nil {
		t.Fatalf("parse: %v", e.Message)
	}
	return q
}

func decodeMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return m
}

func TestSGLangBody(t *testing.T) {
	t.Parallel()
	q := mustParse(t, routeChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"bootstrap_room":7,"stream":true}`)
	out := appendSGLangBody(nil, q, `"10.0.0.1"`, 8998)
	m := decodeMap(t, out)
	if m["bootstrap_host"] != "10.0.0.1" || m["bootstrap_port"] != json.Number("8998") || m["stream"] != true || m["model"] != "m" {
		t.Fatalf("body %s", out)
	}
	if m["bootstrap_room"] == json.Number("7") {
		t.Fatalf("client's bootstrap_room kept: %s", out)
	}
	if strings.Count(string(out), "bootstrap_room") != 1 {
		t.Fatalf("duplicate bootstrap_room: %s", out)
	}

	q = mustParse(t, routeGenerate, `{"text":["a","b"],"sampling_params":{"n":2}}`)
	q.model = "inferred"
	out = appendSGLangBody(nil, q, `"h"`, 0)
	m = decodeMap(t, out)
	hosts, _ := m["bootstrap_host"].([]any)
	ports, _ := m["bootstrap_port"].([]any)
	rooms, _ := m["bootstrap_room"].([]any)
	if len(hosts) != 4 || len(ports) != 4 || len(rooms) != 4 || ports[0] != nil || m["model"] != "inferred" {
		t.Fatalf("batch body %s", out)
	}
	seen := map[any]bool{}
	for _, r := range rooms {
		if seen[r] {
			t.Fatalf("rooms repeat: %s", out)
		}
		seen[r] = true
	}
}

func TestVLLMBodies(t *testing.T) {
	t.Parallel()
	q := mustParse(t, routeChat, `{"model":"m","messages":[1],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"min_tokens":3,"max_completion_tokens":50,"kv_transfer_params":{"x":1}}`)
	p := decodeMap(t, appendVLLMPrefillBody(nil, q))
	kv, _ := p["kv_transfer_params"].(map[string]any)
	if p["stream"] != false || p["max_tokens"] != json.Number("1") || p["max_completion_tokens"] != json.Number("1") ||
		p["stream_options"] != nil || p["min_tokens"] != nil || kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false {
		t.Fatalf("prefill body %v", p)
	}
	for _, k := range []string{"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"} {
		if v, ok := kv[k]; !ok || v != nil {
			t.Fatalf("kv_transfer_params.%s = %v, want null", k, v)
		}
	}
	d := decodeMap(t, appendVLLMDecodeBody(nil, q, []byte(`{"do_remote_prefill":true,"remote_engine_id":"e"}`)))
	kv, _ = d["kv_transfer_params"].(map[string]any)
	if d["stream"] != true || d["max_tokens"] != json.Number("50") || d["min_tokens"] != json.Number("3") || d["stream_options"] == nil ||
		kv["remote_engine_id"] != "e" {
		t.Fatalf("decode body %v", d)
	}

	q = mustParse(t, routeCompletions, `{"model":"m","prompt":"x"}`)
	p = decodeMap(t, appendVLLMPrefillBody(nil, q))
	if _, ok := p["max_completion_tokens"]; ok {
		t.Fatalf("completions prefill got max_completion_tokens: %v", p)
	}
	d = decodeMap(t, appendVLLMDecodeBody(nil, q, []byte("null")))
	if _, ok := d["kv_transfer_params"]; ok {
		t.Fatalf("null kv_transfer_params passed on: %v", d)
	}
}

func TestMergeInputLogprobs(t *testing.T) {
	t.Parallel()
	prefill := []byte(`{"text":"x","meta_info":{"input_token_logprobs":[[-0.5,1,null],[-0.25,2,null]],"id":"p"}}`)
	decode := []byte(`{"text":"hello","meta_info":{"id":"d","input_token_logprobs":[[-0.125,3,null]],"output_token_logprobs":[[-1,4,null]]}}`)
	pre, err := prefillLogprobs(prefill)
	if err != nil {
		t.Fatal(err)
	}
	out, err := mergeInputLogprobs(pre, decode)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Text     string `json:"text"`
		MetaInfo struct {
			In  [][]any `json:"input_token_logprobs"`
			Out [][]any `json:"output_token_logprobs"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if got.Text != "hello" || len(got.MetaInfo.In) != 3 || got.MetaInfo.In[0][0] != -0.5 || got.MetaInfo.In[2][0] != -0.125 || len(got.MetaInfo.Out) != 1 {
		t.Fatalf("merged %s", out)
	}

	// Batch answers merge element by element; empty decode lists and
	// missing lists work.
	prefillBatch := []byte(`[{"meta_info":{"input_token_logprobs":[[-1,1,null]]}},{"meta_info":{"input_token_logprobs":[[-2,2,null]]}}]`)
	decodeBatch := []byte(`[{"text":"a","meta_info":{"input_token_logprobs":[]}}, {"text":"b","meta_info":{"id":"x"}}]`)
	pre, err = prefillLogprobs(prefillBatch)
	if err != nil {
		t.Fatal(err)
	}
	out, err = mergeInputLogprobs(pre, decodeBatch)
	if err != nil {
		t.Fatal(err)
	}
	var batch []struct {
		MetaInfo struct {
			In [][]any `json:"input_token_logprobs"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(out, &batch); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if len(batch) != 2 || len(batch[0].MetaInfo.In) != 1 || batch[0].MetaInfo.In[0][0] != -1.0 || batch[1].MetaInfo.In[0][0] != -2.0 {
		t.Fatalf("merged batch %s", out)
	}

	// A streamed prefill answer: the first data event.
	pre, err = prefillLogprobs([]byte("data: " + string(prefill) + "\n\ndata: [DONE]\n\n"))
	if err != nil || len(pre) != 1 {
		t.Fatalf("stream prefill: %v %v", pre, err)
	}
	ev := mergeSSEEvent([]byte("data: "+string(decode)+"\n\n"), pre)
	if !strings.HasPrefix(string(ev), "data: {") || !strings.HasSuffix(string(ev), "\n\n") || !strings.Contains(string(ev), `[[-0.5,1,null],[-0.25,2,null],[-0.125,3,null]]`) {
		t.Fatalf("merged event %q", ev)
	}
	if got := mergeSSEEvent([]byte("data: [DONE]\n\n"), pre); string(got) != "data: [DONE]\n\n" {
		t.Fatalf("[DONE] changed: %q", got)
	}
}
