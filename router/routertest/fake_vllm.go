package routertest

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

// FakeVLLM is a vLLM engine with NixlConnector, prefill or decode, over real
// HTTP: /v1/chat/completions and /v1/completions. A prefill refuses (400)
// a request that is streamed, carries stream_options, asks for more than one
// token or lacks kv_transfer_params.do_remote_decode; it answers with
// kv_transfer_params naming its blocks. A decode refuses kv_transfer_params
// that do not come from a prefill, and streams Behavior.Chunks chunks.
type FakeVLLM struct {
	*Fake
}

// NewFakeVLLM starts a fake vLLM engine; Close it when done.
func NewFakeVLLM(name string, role registry.Role) *FakeVLLM {
	return &FakeVLLM{newFake(name, role, registry.EngineVLLM, serveVLLM)}
}

// StartVLLM starts a fake vLLM engine closed with the test.
func StartVLLM(t testing.TB, name string, role registry.Role) *FakeVLLM {
	f := NewFakeVLLM(name, role)
	t.Cleanup(f.Close)
	return f
}

// EngineID is the remote_engine_id the fake prefill hands out.
func (f *FakeVLLM) EngineID() string { return "engine-" + f.Name }

func serveVLLM(f *Fake, w http.ResponseWriter, r *http.Request, req *Request, b Behavior) {
	route := routeOf(r.URL.Path)
	if r.Method != http.MethodPost || route == "" || route == "generate" {
		if r.URL.Path == "/health" {
			w.WriteHeader(http.StatusOK)
			return
		}
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	id := "cmpl-" + requestID(req)
	model := f.modelOf(req)
	kv, _ := req.JSON["kv_transfer_params"].(map[string]any)

	if f.Role == registry.RolePrefill {
		mt, _ := intOf(req.JSON["max_tokens"])
		switch {
		case kv == nil || kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false:
			writeError(w, http.StatusBadRequest, "prefill needs kv_transfer_params with do_remote_decode=true")
			return
		case isTrue(req.JSON["stream"]) || req.JSON["stream_options"] != nil:
			writeError(w, http.StatusBadRequest, "prefill must not stream")
			return
		case mt != 1:
			writeError(w, http.StatusBadRequest, "prefill must ask for max_tokens=1")
			return
		case route == "chat" && req.JSON["max_completion_tokens"] != nil && req.JSON["max_completion_tokens"] != json.Number("1"):
			writeError(w, http.StatusBadRequest, "prefill must ask for max_completion_tokens=1")
			return
		case req.JSON["min_tokens"] != nil:
			writeError(w, http.StatusBadRequest, "min_tokens is not supported on a prefill")
			return
		}
		extra := map[string]any{"kv_transfer_params": map[string]any{
			"do_remote_prefill": true,
			"do_remote_decode":  false,
			"remote_block_ids":  []int{1, 2, 3},
			"remote_engine_id":  "engine-" + f.Name,
			"remote_host":       "127.0.0.1",
			"remote_port":       5600,
			"tp_size":           1,
		}}
		tok := tokens(f.Name, 1)[0]
		if route == "chat" {
			writeJSONBody(w, chatCompletion(id, model, tok, extra))
		} else {
			writeJSONBody(w, completion(id, model, tok, extra))
		}
		return
	}

	if kv != nil {
		eng, _ := kv["remote_engine_id"].(string)
		if kv["do_remote_prefill"] != true || !strings.HasPrefix(eng, "engine-") {
			writeError(w, http.StatusBadRequest, "decode got kv_transfer_params that no prefill produced")
			return
		}
	}
	n := b.chunks()
	toks := tokens(f.Name, n)
	if !isTrue(req.JSON["stream"]) {
		if route == "chat" {
			writeJSONBody(w, chatCompletion(id, model, strings.Join(toks, ""), nil))
		} else {
			writeJSONBody(w, completion(id, model, strings.Join(toks, ""), nil))
		}
		return
	}
	cw := &chunkWriter{w: w, r: r, b: b}
	cw.start()
	for i := range n {
		var payload []byte
		if route == "chat" {
			payload = chatChunk(id, model, i, n-1, toks[i])
		} else {
			payload = completionChunk(id, model, i, n-1, toks[i])
		}
		if !cw.chunk(i, payload) {
			return
		}
	}
	cw.done()
}
