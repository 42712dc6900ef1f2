package routertest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

// FakeSGLang is an SGLang engine in PD mode, prefill or decode, over real
// HTTP: /generate, /v1/chat/completions and /v1/completions. Every
// generation request must carry the bootstrap triple (scalars, or lists of
// batch × n for a batch or n > 1) or it is refused with 400. A prefill
// answers with one token; a decode streams Behavior.Chunks chunks.
type FakeSGLang struct {
	*Fake
}

// NewFakeSGLang starts a fake SGLang engine; Close it when done.
func NewFakeSGLang(name string, role registry.Role) *FakeSGLang {
	return &FakeSGLang{newFake(name, role, registry.EngineSGLang, serveSGLang)}
}

// StartSGLang starts a fake SGLang engine closed with the test.
func StartSGLang(t testing.TB, name string, role registry.Role) *FakeSGLang {
	f := NewFakeSGLang(name, role)
	t.Cleanup(f.Close)
	return f
}

// Bootstrap is the bootstrap triple one request carried.
type Bootstrap struct {
	Hosts []string
	Ports []int64
	Rooms []uint64
	List  bool // sent as lists
}

// BootstrapOf reads the bootstrap triple of a recorded request.
func BootstrapOf(req Request) (Bootstrap, error) {
	var bs Bootstrap
	h, p, r := req.JSON["bootstrap_host"], req.JSON["bootstrap_port"], req.JSON["bootstrap_room"]
	if h == nil || r == nil {
		return bs, fmt.Errorf("missing bootstrap_host or bootstrap_room")
	}
	if hl, ok := h.([]any); ok {
		bs.List = true
		pl, okP := p.([]any)
		rl, okR := r.([]any)
		if !okP || !okR || len(pl) != len(hl) || len(rl) != len(hl) {
			return bs, fmt.Errorf("bootstrap lists of unequal lengths or types")
		}
		for i := range hl {
			if err := bs.add(hl[i], pl[i], rl[i]); err != nil {
				return bs, fmt.Errorf("bootstrap[%d]: %w", i, err)
			}
		}
		return bs, nil
	}
	return bs, bs.add(h, p, r)
}

func (bs *Bootstrap) add(h, p, r any) error {
	hs, ok := h.(string)
	if !ok || hs == "" {
		return fmt.Errorf("bootstrap_host %v is not a host", h)
	}
	port := int64(-1)
	if p != nil {
		n, ok := p.(json.Number)
		if !ok {
			return fmt.Errorf("bootstrap_port %v is not a number", p)
		}
		v, err := n.Int64()
		if err != nil {
			return fmt.Errorf("bootstrap_port %v: %w", p, err)
		}
		port = v
	}
	rn, ok := r.(json.Number)
	if !ok {
		return fmt.Errorf("bootstrap_room %v is not a number", r)
	}
	var room uint64
	if _, err := fmt.Sscan(rn.String(), &room); err != nil || room > math.MaxInt64 {
		return fmt.Errorf("bootstrap_room %v is not in [0, 2^63)", r)
	}
	bs.Hosts = append(bs.Hosts, hs)
	bs.Ports = append(bs.Ports, port)
	bs.Rooms = append(bs.Rooms, room)
	return nil
}

// ExpectedBootstrapLen is how many bootstrap entries SGLang needs for the
// request: 0 (scalars) for one prompt sampled once, else batch × n.
func ExpectedBootstrapLen(route string, body map[string]any) int {
	batch, n := 0, 1
	switch route {
	case "generate":
		batch = max(batchOf(body["text"]), batchOf(body["input_ids"]))
		if sp, ok := body["sampling_params"].(map[string]any); ok {
			if v, ok := intOf(sp["n"]); ok {
				n = v
			}
		}
	case "completions":
		batch = batchOf(body["prompt"])
		if v, ok := intOf(body["n"]); ok {
			n = v
		}
	case "chat":
		if v, ok := intOf(body["n"]); ok {
			n = v
		}
	}
	if batch == 0 && n <= 1 {
		return 0
	}
	return max(batch, 1) * n
}

func serveSGLang(f *Fake, w http.ResponseWriter, r *http.Request, req *Request, b Behavior) {
	route := routeOf(r.URL.Path)
	if r.Method != http.MethodPost || route == "" {
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusOK)
			return
		}
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	bs, err := BootstrapOf(*req)
	if err != nil {
		writeError(w, http.StatusBadRequest, "PD mode needs the bootstrap triple: "+err.Error())
		return
	}
	want := ExpectedBootstrapLen(route, req.JSON)
	switch {
	case want == 0 && bs.List:
		writeError(w, http.StatusBadRequest, "bootstrap lists given for a single prompt")
		return
	case want > 0 && (!bs.List || len(bs.Rooms) != want):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("want %d bootstrap entries, got %d (list %t)", want, len(bs.Rooms), bs.List))
		return
	}
	seen := map[uint64]bool{}
	for _, room := range bs.Rooms {
		if seen[room] {
			writeError(w, http.StatusBadRequest, "bootstrap rooms repeat")
			return
		}
		seen[room] = true
	}

	stream := isTrue(req.JSON["stream"])
	n := b.chunks()
	if f.Role == registry.RolePrefill {
		n = 1
	}
	toks := tokens(f.Name, n)
	id := "cmpl-" + requestID(req)
	model := f.modelOf(req)
	logprob := route == "generate" && isTrue(req.JSON["return_logprob"])

	if !stream {
		var out []byte
		switch route {
		case "chat":
			out = chatCompletion(id, model, strings.Join(toks, ""), nil)
		case "completions":
			out = completion(id, model, strings.Join(toks, ""), nil)
		default:
			batch := max(batchOf(req.JSON["text"]), batchOf(req.JSON["input_ids"]))
			if batch == 0 {
				out = f.generateAnswer(id, strings.Join(toks, ""), n, logprob, -1)
			} else {
				parts := make([]string, batch)
				for i := range parts {
					parts[i] = string(f.generateAnswer(id, strings.Join(toks, ""), n, logprob, i))
				}
				out = []byte("[" + strings.Join(parts, ",") + "]")
			}
		}
		writeJSONBody(w, out)
		return
	}

	cw := &chunkWriter{w: w, r: r, b: b}
	cw.start()
	text := ""
	for i := range n {
		var payload []byte
		switch route {
		case "chat":
			payload = chatChunk(id, model, i, n-1, toks[i])
		case "completions":
			payload = completionChunk(id, model, i, n-1, toks[i])
		default:
			text += toks[i]
			payload = f.generateAnswer(id, text, i+1, logprob, -1)
		}
		if !cw.chunk(i, payload) {
			return
		}
	}
	cw.done()
}

// generateAnswer renders one /generate answer; index >= 0 marks a batch
// element.
func (f *Fake) generateAnswer(id, text string, completionTokens int, logprob bool, index int) []byte {
	meta := map[string]any{
		"id":                id,
		"finish_reason":     map[string]any{"type": "length", "length": completionTokens},
		"prompt_tokens":     3,
		"completion_tokens": completionTokens,
	}
	if logprob {
		meta["input_token_logprobs"] = json.RawMessage(f.InputLogprobs)
		meta["output_token_logprobs"] = json.RawMessage(`[[-0.0625,9,null]]`)
	}
	m := map[string]any{"text": text, "meta_info": meta}
	if index >= 0 {
		m["index"] = index
	}
	out, _ := json.Marshal(m)
	return out
}
