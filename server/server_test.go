package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/server"
)

const (
	adminToken = "admin-secret"
	peerToken  = "peer-secret"
)

type bundle struct {
	url    string
	store  registry.Store
	mirror *registry.Mirror
}

func setup(t testing.TB) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.Nop() // a fuzz target may not log through its *testing.F
	if tt, ok := t.(*testing.T); ok {
		log = zerolog.New(zerolog.NewTestWriter(tt))
	}
	store := memstore.New(memstore.Config{})
	mirror := registry.NewMirror(registry.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{AdminToken: adminToken, PeerToken: peerToken, MaxBodyBytes: 8 << 20},
		server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &bundle{url: ts.URL, store: store, mirror: mirror}
}

// do sends a request with a JSON body (a string is sent as is) and returns
// the status and decoded JSON answer.
func (b *bundle) do(t *testing.T, method, path, token string, body any) (int, map[string]any, http.Header) {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, b.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(data) > 0 && strings.Contains(resp.Header.Get("Content-Type"), "json") {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: answer is not JSON: %v\n%s", method, path, err, data)
		}
	}
	return resp.StatusCode, out, resp.Header
}

func (b *bundle) register(t *testing.T, spec registry.PeerSpec) map[string]any {
	t.Helper()
	code, out, _ := b.do(t, "POST", "/api/v1/peers", peerToken, spec)
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("register %s: %d %v", spec.Name, code, out)
	}
	return out
}

func (b *bundle) heartbeat(t *testing.T, id, instance string) map[string]any {
	t.Helper()
	code, out, _ := b.do(t, "POST", "/api/v1/peers/"+id+"/heartbeat", peerToken, map[string]any{"instance_id": instance})
	if code != http.StatusOK {
		t.Fatalf("heartbeat: %d %v", code, out)
	}
	return out
}

func TestRegisterCreatesThenUpdates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := registrytest.Spec("p0", registry.RolePrefill)
	code, first, _ := b.do(t, "POST", "/api/v1/peers", peerToken, spec)
	if code != http.StatusCreated {
		t.Fatalf("first registration: %d %v", code, first)
	}
	for k, want := range map[string]any{"generation": 1.0, "state": "pending", "heartbeat_interval_seconds": 1.0, "lease_ttl_seconds": 10.0, "bootstrap_port": 8998.0} {
		if first[k] != want {
			t.Errorf("%s = %v, want %v", k, first[k], want)
		}
	}
	ranks := first["ranks"].([]any)
	r0 := ranks[0].(map[string]any)
	if !reflect.DeepEqual(r0["kv_mem_kinds"], []any{"VRAM", "VRAM"}) || r0["agent_metadata"] != "bWV0YS1wMA==" {
		t.Errorf("rank 0 = %v", r0)
	}
	code, again, _ := b.do(t, "POST", "/api/v1/peers", peerToken, spec)
	if code != http.StatusOK || again["id"] != first["id"] || again["generation"] != 1.0 {
		t.Fatalf("same registration again: %d id=%v gen=%v", code, again["id"], again["generation"])
	}
	spec.InstanceID = "restarted"
	_, bumped, _ := b.do(t, "POST", "/api/v1/peers", peerToken, spec)
	if bumped["id"] != first["id"] || bumped["generation"] != 2.0 {
		t.Fatalf("new instance: id=%v gen=%v, want same id and generation 2", bumped["id"], bumped["generation"])
	}
}

// TestBadRegistrations pins that every malformed registration gets a 4xx
// problem naming the field and that nothing stored changes.
func TestBadRegistrations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := registrytest.Spec("victim", registry.RoleDecode)
	b.register(t, good)
	before, _ := b.store.List(context.Background(), registry.Filter{})

	mutate := func(f func(m map[string]any)) []byte {
		data, _ := json.Marshal(good)
		var m map[string]any
		_ = json.Unmarshal(data, &m)
		f(m)
		out, _ := json.Marshal(m)
		return out
	}
	rank := func(m map[string]any, i int) map[string]any { return m["ranks"].([]any)[i].(map[string]any) }
	twoRanks := func(m map[string]any) {
		r := map[string]any{}
		for k, v := range rank(m, 0) {
			r[k] = v
		}
		r["rank"], r["agent_name"] = 1, "victim-agent-1"
		m["ranks"] = append(m["ranks"].([]any), r)
	}
	for _, tc := range []struct {
		name   string
		body   any
		token  string
		status int
		field  string
	}{
		{"unknown memory kind", mutate(func(m map[string]any) { twoRanks(m); rank(m, 1)["kv_mem_kinds"] = []any{"VRAM", "HBM"} }), peerToken, 422, "ranks[1].kv_mem_kinds[1]"},
		{"memory kinds missing", mutate(func(m map[string]any) { twoRanks(m); delete(rank(m, 1), "kv_mem_kinds") }), peerToken, 422, "ranks[1].kv_mem_kinds"},
		{"memory kinds too few", mutate(func(m map[string]any) { rank(m, 0)["kv_mem_kinds"] = []any{"VRAM"} }), peerToken, 422, "ranks[0].kv_mem_kinds"},
		{"memory kind not a string", mutate(func(m map[string]any) { rank(m, 0)["kv_mem_kinds"] = []any{1, 1} }), peerToken, 400, "ranks.kv_mem_kinds"},
		{"zero region length", mutate(func(m map[string]any) { rank(m, 0)["kv_data_lens"] = []any{0, 4096} }), peerToken, 422, "ranks[0].kv_data_lens[0]"},
		{"negative page size", mutate(func(m map[string]any) { m["kv"].(map[string]any)["page_size"] = -16 }), peerToken, 422, "kv.page_size"},
		{"zero tp", mutate(func(m map[string]any) { m["parallelism"].(map[string]any)["tp_size"] = 0 }), peerToken, 422, "parallelism.tp_size"},
		{"ftp url", mutate(func(m map[string]any) { m["url"] = "ftp://127.0.0.1/x" }), peerToken, 422, "url"},
		{"unknown role", mutate(func(m map[string]any) { m["role"] = "router" }), peerToken, 422, "role"},
		{"overlapping regions", mutate(func(m map[string]any) {
			rank(m, 0)["kv_data_ptrs"] = []any{0x10000, 0x10010}
		}), peerToken, 422, "ranks[0].kv_data_ptrs[1]"},
		{"no ranks, not listed unknown", mutate(func(m map[string]any) { delete(m, "ranks") }), peerToken, 422, "ranks"},
		{"empty ranks, not listed unknown", mutate(func(m map[string]any) { m["ranks"] = []any{} }), peerToken, 422, "ranks"},
		{"ranks unknown but given", mutate(func(m map[string]any) { m["unknown"] = []any{"ranks"} }), peerToken, 422, "ranks"},
		{"layers absent, not listed unknown", mutate(func(m map[string]any) { delete(m["kv"].(map[string]any), "num_layers") }), peerToken, 422, "kv.num_layers"},
		{"model may not be unknown", mutate(func(m map[string]any) { m["unknown"] = []any{"model"} }), peerToken, 422, "unknown[0]"},
		{"a declared rank beside unknowns still needs its kinds", mutate(func(m map[string]any) {
			m["unknown"] = []any{"kv.num_layers"}
			delete(m["kv"].(map[string]any), "num_layers")
			delete(rank(m, 0), "kv_mem_kinds")
		}), peerToken, 422, "ranks[0].kv_mem_kinds"},
		{"malformed JSON", `{"name": "victim", "role":`, peerToken, 400, "body"},
		{"not JSON at all", `name=victim`, peerToken, 400, "body"},
		{"empty body", ``, peerToken, 400, "body"},
		{"body over the limit", `{"name": "` + strings.Repeat("x", 9<<20) + `"}`, peerToken, 413, "body"},
		{"no token", good, "", 401, "Authorization"},
		{"wrong token", good, "nope", 401, "Authorization"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, hdr := b.do(t, "POST", "/api/v1/peers", tc.token, tc.body)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %v", code, tc.status, out)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("content type %q", ct)
			}
			if out["field"] != tc.field || out["type"] == "" || out["detail"] == "" || out["status"] != float64(tc.status) {
				t.Fatalf("problem = %v, want field %q", out, tc.field)
			}
		})
	}
	after, _ := b.store.List(context.Background(), registry.Filter{})
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused registration changed the store:\nbefore %+v\nafter  %+v", before, after)
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.register(t, registrytest.Spec("p0", registry.RolePrefill))
	id := p["id"].(string)
	for _, tc := range []struct {
		method, path, token string
		body                any
		want                int
	}{
		{"GET", "/api/v1/peers", "", nil, 200}, // reads are open
		{"GET", "/api/v1/pairs", "", nil, 200},
		{"POST", "/api/v1/peers/" + id + "/heartbeat", "", map[string]any{"instance_id": "inst-p0"}, 401},
		{"POST", "/api/v1/peers/" + id + "/heartbeat", adminToken, map[string]any{"instance_id": "inst-p0"}, 200}, // admin works where peer does
		{"POST", "/api/v1/peers/" + id + "/drain", peerToken, nil, 401},                                           // peer token is not admin
		{"POST", "/api/v1/peers/" + id + "/drain", adminToken, nil, 200},
		{"POST", "/api/v1/peers/" + id + "/stale", peerToken, map[string]any{"reason": "r"}, 200},
		{"DELETE", "/api/v1/peers/" + id, peerToken, nil, 401},
		{"DELETE", "/api/v1/peers/" + id, adminToken, nil, 204},
		{"DELETE", "/api/v1/peers/" + id, adminToken, nil, 404},
	} {
		if code, out, _ := b.do(t, tc.method, tc.path, tc.token, tc.body); code != tc.want {
			t.Errorf("%s %s with %q: %d, want %d (%v)", tc.method, tc.path, tc.token, code, tc.want, out)
		}
	}
}

func TestHeartbeatStaleAndReregister(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := registrytest.Spec("d0", registry.RoleDecode)
	d := b.register(t, spec)
	id := d["id"].(string)
	if hb := b.heartbeat(t, id, spec.InstanceID); hb["action"] != "none" || hb["state"] != "ready" {
		t.Fatalf("first heartbeat: %v", hb)
	}
	code, st, _ := b.do(t, "POST", "/api/v1/peers/"+id+"/stale", peerToken,
		map[string]any{"reason": "transfer failed", "error": "RuntimeError: Missing NIXL destination KV memory kind"})
	if code != 200 || st["state"] != "stale" {
		t.Fatalf("stale: %d %v", code, st)
	}
	if hb := b.heartbeat(t, id, spec.InstanceID); hb["action"] != "reregister" {
		t.Fatalf("heartbeat after stale: %v, want reregister", hb)
	}
	spec.Ranks[0].AgentName = "d0-agent-fresh"
	if again := b.register(t, spec); again["state"] != "ready" || again["generation"] != 2.0 || again["id"] != id {
		t.Fatalf("re-registration: %v", again)
	}
	for _, tc := range []struct {
		path string
		body any
		want int
		fld  string
	}{
		{"/api/v1/peers/" + id + "/heartbeat", map[string]any{}, 422, "instance_id"},
		{"/api/v1/peers/" + id + "/heartbeat", map[string]any{"instance_id": "x", "load": map[string]any{"running": -1, "queued": 0, "kv_usage": 0}}, 422, "load.running"},
		{"/api/v1/peers/" + id + "/stale", map[string]any{"reason": ""}, 422, "reason"},
		{"/api/v1/peers/00000000-0000-4000-8000-000000000000/heartbeat", map[string]any{"instance_id": "x"}, 404, ""},
	} {
		code, out, _ := b.do(t, "POST", tc.path, peerToken, tc.body)
		if code != tc.want || (tc.fld != "" && out["field"] != tc.fld) {
			t.Errorf("POST %s %v: %d %v, want %d field %q", tc.path, tc.body, code, out, tc.want, tc.fld)
		}
	}
}

// waitFor polls cond until it holds, e.g. until the mirror has caught up
// with the store.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUnhealthyDecode: a heartbeat whose agent reports the engine down
// takes the decode out of routing; /readyz says so and names it, the page's
// API and the metrics show the state, and the next healthy heartbeat brings
// it back.
func TestUnhealthyDecode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := func(path string) (int, string) {
		resp, err := http.Get(b.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	pf, dv := registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode)
	p, d := b.register(t, pf), b.register(t, dv)
	b.heartbeat(t, p["id"].(string), pf.InstanceID)
	b.heartbeat(t, d["id"].(string), dv.InstanceID)
	waitFor(t, "a routable pair", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })

	hbPath := "/api/v1/peers/" + d["id"].(string) + "/heartbeat"
	code, out, _ := b.do(t, "POST", hbPath, peerToken, map[string]any{
		"instance_id": dv.InstanceID, "engine_healthy": false, "engine_error": "GET /health: connection refused"})
	if code != 200 || out["state"] != "unhealthy" || out["action"] != "none" {
		t.Fatalf("heartbeat with the engine down: %d %v", code, out)
	}
	waitFor(t, "the decode out of routing", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return !ok })
	code, body := get("/readyz")
	if want := "not ready: model m: no ready decode (unhealthy: decode d0: engine unhealthy: GET /health: connection refused)"; code != 503 || strings.TrimSpace(body) != want {
		t.Fatalf("readyz: %d %q, want 503 %q", code, body, want)
	}
	if code, out, _ := b.do(t, "GET", "/api/v1/peers/"+d["id"].(string), "", nil); code != 200 || out["state"] != "unhealthy" ||
		out["state_reason"] != "engine unhealthy: GET /health: connection refused" {
		t.Fatalf("peer: %d %v", code, out)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `pdplane_peers{role="decode",state="unhealthy"} 1`) {
		t.Fatalf("metrics: %d, want one unhealthy decode\n%s", code, body)
	}

	if hb := b.heartbeat(t, d["id"].(string), dv.InstanceID); hb["state"] != "ready" {
		t.Fatalf("heartbeat with the engine back: %v", hb)
	}
	waitFor(t, "the decode back in routing", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })

	for _, tc := range []struct {
		body map[string]any
		fld  string
	}{
		{map[string]any{"instance_id": dv.InstanceID, "engine_error": "boom"}, "engine_error"},
		{map[string]any{"instance_id": dv.InstanceID, "engine_healthy": false, "engine_error": "a\nb"}, "engine_error"},
		{map[string]any{"instance_id": dv.InstanceID, "engine_healthy": false, "engine_error": strings.Repeat("x", registry.MaxEngineErrorLen+1)}, "engine_error"},
		{map[string]any{"instance_id": dv.InstanceID, "load": map[string]any{"running": 0, "queued": 0, "kv_usage": 1.5}}, "load.kv_usage"},
	} {
		code, out, _ := b.do(t, "POST", hbPath, peerToken, tc.body)
		if code != 422 || out["field"] != tc.fld {
			t.Errorf("heartbeat %v: %d %v, want 422 naming %s", tc.body, code, out, tc.fld)
		}
	}
	if got, err := b.store.Get(context.Background(), d["id"].(string)); err != nil || got.State != registry.StateReady {
		t.Fatalf("refused heartbeats changed the peer: %+v %v", got.State, err)
	}
}

func TestPairsAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := func(path string) (int, string) {
		resp, err := http.Get(b.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no ready peers") {
		t.Fatalf("readyz with nothing: %d %q", code, body)
	}
	pf := registrytest.Spec("p0", registry.RolePrefill)
	dv := registrytest.Spec("d0", registry.RoleDecode)
	dram := registrytest.Spec("d1", registry.RoleDecode)
	dram.Ranks[0].KVMemKinds = []registry.MemKind{registry.VRAM, registry.DRAM}
	dram.Ranks[0].KVDataPtrs = []uint64{0x1000000, 0x2000000}
	for _, s := range []registry.PeerSpec{pf, dv, dram} {
		p := b.register(t, s)
		b.heartbeat(t, p["id"].(string), s.InstanceID)
	}
	waitFor(t, "three ready peers in the snapshot", func() bool {
		r := b.mirror.Snapshot().Routes("m")
		return r != nil && len(r.Prefills)+len(r.Decodes) == 3
	})
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("readyz with a ready pair: %d %q", code, body)
	}

	code, out, _ := b.do(t, "GET", "/api/v1/pairs", "", nil)
	if code != 200 || out["total"] != 2.0 {
		t.Fatalf("pairs: %d %v", code, out)
	}
	byDecode := map[string]map[string]any{}
	for _, p := range out["pairs"].([]any) {
		pm := p.(map[string]any)
		byDecode[pm["decode"].(map[string]any)["name"].(string)] = pm
	}
	if d0 := byDecode["d0"]; d0["compatible"] != true || d0["routable"] != true || d0["path"] != "equal_tp" {
		t.Errorf("p0→d0 = %v", d0)
	}
	// d1 mixes kinds but has as many regions as p0, so it is a mixed-segment pair.
	if d1 := byDecode["d1"]; d1["compatible"] != true || d1["path"] != "mixed_segments" {
		t.Errorf("p0→d1 = %v", d1)
	}
	if code, out, _ := b.do(t, "GET", "/api/v1/pairs?limit=0", "", nil); code != 400 || out["field"] != "limit" {
		t.Errorf("limit=0: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "GET", "/api/v1/peers?role=router", "", nil); code != 400 || out["field"] != "role" {
		t.Errorf("role=router: %d %v", code, out)
	}
	code, list, _ := b.do(t, "GET", "/api/v1/peers?role=decode&state=ready", "", nil)
	if code != 200 || len(list["peers"].([]any)) != 2 {
		t.Errorf("decode filter: %d %v", code, list)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `pdplane_peers{role="decode",state="ready"} 2`) {
		t.Errorf("metrics: %d\n%s", code, body)
	}
}

func TestEventsPageAndStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := 0; i < 3; i++ {
		b.register(t, registrytest.Spec(fmt.Sprintf("p%d", i), registry.RolePrefill))
	}
	code, page, _ := b.do(t, "GET", "/api/v1/events?limit=2", "", nil)
	if code != 200 || len(page["events"].([]any)) != 2 || page["next_cursor"] == nil {
		t.Fatalf("events page: %d %v", code, page)
	}
	first := page["events"].([]any)[0].(map[string]any)
	if first["peer_name"] != "p2" || first["kind"] != "registered" {
		t.Fatalf("newest event = %v", first)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url+"/api/v1/events/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("stream content type %q", ct)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// Only events after the stream opened arrive; p3 is new.
	b.register(t, registrytest.Spec("p3", registry.RolePrefill))
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("stream ended")
			}
			if data, found := strings.CutPrefix(l, "data: "); found {
				var ev map[string]any
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatalf("event data: %v", err)
				}
				if ev["peer_name"] != "p3" || ev["kind"] != "registered" {
					t.Fatalf("first streamed event = %v, want p3 registered", ev)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no event streamed")
		}
	}
}
