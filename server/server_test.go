package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/server/api/apiconv"
	"github.com/pdplane/pdplane/sim/simtest"
)

const (
	adminToken = "admin-secret"
	joinToken  = "join-secret"
	oldJoin    = "join-secret-before-rotation"
)

type bundle struct {
	url    string
	store  registry.Store
	mirror *replica.Mirror
	reg    *prometheus.Registry
	srv    *server.Server

	mu    sync.Mutex
	creds map[string]string // peer ID -> the credential its registration issued
	ids   map[string]string // peer name -> ID
}

func (b *bundle) cred(id string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.creds[id]
}

func setup(t testing.TB) *bundle {
	t.Helper()
	return setupWith(t, nil)
}

// setupWith is setup with a chance to change the server's config and
// collaborators before it is built.
func setupWith(t testing.TB, change func(*server.Config, *server.Deps)) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.Nop() // a fuzz target may not log through its *testing.F
	if tt, ok := t.(*testing.T); ok {
		log = zerolog.New(zerolog.NewTestWriter(tt))
	}
	store := memstore.New(memstore.Config{})
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{AdminToken: adminToken, JoinTokens: []string{joinToken, oldJoin}, MaxBodyBytes: 8 << 20}
	deps := server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}
	if change != nil {
		change(&cfg, &deps)
	}
	srv, err := server.New(cfg, deps, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &bundle{url: ts.URL, store: store, mirror: mirror, reg: deps.Registry, srv: srv, creds: map[string]string{}, ids: map[string]string{}}
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
	case registry.PeerSpec:
		rd = bytes.NewReader(specJSON(v))
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

// register registers spec with the join token, or with the credential of
// the peer when the bundle holds one, and keeps any credential issued.
// specJSON is spec as a registration body, the way an agent sends it.
func specJSON(spec registry.PeerSpec) []byte {
	data, err := json.Marshal(apiconv.Registration(&spec))
	if err != nil {
		panic(err)
	}
	return data
}

func (b *bundle) register(t *testing.T, spec registry.PeerSpec) map[string]any {
	t.Helper()
	token := joinToken
	b.mu.Lock()
	if c, ok := b.creds[b.ids[spec.Name]]; ok {
		token = c
	}
	b.mu.Unlock()
	code, out, _ := b.do(t, "POST", "/api/v1/peers", token, spec)
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("register %s: %d %v", spec.Name, code, out)
	}
	if c, ok := out["credential"].(string); ok {
		b.mu.Lock()
		b.creds[out["id"].(string)] = c
		b.ids[spec.Name] = out["id"].(string)
		b.mu.Unlock()
	}
	return out
}

func (b *bundle) heartbeat(t *testing.T, id, instance string) map[string]any {
	t.Helper()
	code, out, _ := b.do(t, "POST", "/api/v1/peers/"+id+"/heartbeat", b.cred(id), map[string]any{"instance_id": instance})
	if code != http.StatusOK {
		t.Fatalf("heartbeat: %d %v", code, out)
	}
	return out
}

func TestRegisterCreatesThenUpdates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := registrytest.Spec("p0", registry.RolePrefill)
	code, first, _ := b.do(t, "POST", "/api/v1/peers", joinToken, spec)
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
	cred, _ := first["credential"].(string)
	if !strings.HasPrefix(cred, "pdpc.") {
		t.Fatalf("a new peer's answer carries no credential: %v", first["credential"])
	}
	code, again, _ := b.do(t, "POST", "/api/v1/peers", cred, spec)
	if code != http.StatusOK || again["id"] != first["id"] || again["generation"] != 1.0 || again["credential"] != nil {
		t.Fatalf("same registration again: %d id=%v gen=%v credential=%v", code, again["id"], again["generation"], again["credential"])
	}
	spec.InstanceID = "restarted"
	_, bumped, _ := b.do(t, "POST", "/api/v1/peers", cred, spec)
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
		data := specJSON(good)
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
		{"unknown memory kind", mutate(func(m map[string]any) { twoRanks(m); rank(m, 1)["kv_mem_kinds"] = []any{"VRAM", "HBM"} }), joinToken, 422, "ranks[1].kv_mem_kinds[1]"},
		{"memory kinds missing", mutate(func(m map[string]any) { twoRanks(m); delete(rank(m, 1), "kv_mem_kinds") }), joinToken, 422, "ranks[1].kv_mem_kinds"},
		{"memory kinds too few", mutate(func(m map[string]any) { rank(m, 0)["kv_mem_kinds"] = []any{"VRAM"} }), joinToken, 422, "ranks[0].kv_mem_kinds"},
		{"memory kind not a string", mutate(func(m map[string]any) { rank(m, 0)["kv_mem_kinds"] = []any{1, 1} }), joinToken, 400, "ranks.kv_mem_kinds"},
		{"zero region length", mutate(func(m map[string]any) { rank(m, 0)["kv_data_lens"] = []any{0, 4096} }), joinToken, 422, "ranks[0].kv_data_lens[0]"},
		{"negative page size", mutate(func(m map[string]any) { m["kv"].(map[string]any)["page_size"] = -16 }), joinToken, 422, "kv.page_size"},
		{"zero tp", mutate(func(m map[string]any) { m["parallelism"].(map[string]any)["tp_size"] = 0 }), joinToken, 422, "parallelism.tp_size"},
		{"ftp url", mutate(func(m map[string]any) { m["url"] = "ftp://127.0.0.1/x" }), joinToken, 422, "url"},
		{"unknown role", mutate(func(m map[string]any) { m["role"] = "router" }), joinToken, 422, "role"},
		{"overlapping regions", mutate(func(m map[string]any) {
			rank(m, 0)["kv_data_ptrs"] = []any{0x10000, 0x10010}
		}), joinToken, 422, "ranks[0].kv_data_ptrs[1]"},
		{"no ranks, not listed unknown", mutate(func(m map[string]any) { delete(m, "ranks") }), joinToken, 422, "ranks"},
		{"empty ranks, not listed unknown", mutate(func(m map[string]any) { m["ranks"] = []any{} }), joinToken, 422, "ranks"},
		{"ranks unknown but given", mutate(func(m map[string]any) { m["unknown"] = []any{"ranks"} }), joinToken, 422, "ranks"},
		{"layers absent, not listed unknown", mutate(func(m map[string]any) { delete(m["kv"].(map[string]any), "num_layers") }), joinToken, 422, "kv.num_layers"},
		{"model may not be unknown", mutate(func(m map[string]any) { m["unknown"] = []any{"model"} }), joinToken, 422, "unknown[0]"},
		{"a declared rank beside unknowns still needs its kinds", mutate(func(m map[string]any) {
			m["unknown"] = []any{"kv.num_layers"}
			delete(m["kv"].(map[string]any), "num_layers")
			delete(rank(m, 0), "kv_mem_kinds")
		}), joinToken, 422, "ranks[0].kv_mem_kinds"},
		{"malformed JSON", `{"name": "victim", "role":`, joinToken, 400, "body"},
		{"not JSON at all", `name=victim`, joinToken, 400, "body"},
		{"empty body", ``, joinToken, 400, "body"},
		{"body over the limit", `{"name": "` + strings.Repeat("x", 9<<20) + `"}`, joinToken, 413, "body"},
		{"no token", good, "", 401, "Authorization"},
		{"wrong token", good, "nope", 401, "Authorization"},
		{"join token on a held name", good, joinToken, 403, "Authorization"},
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
	d := b.register(t, registrytest.Spec("d0", registry.RoleDecode))
	p1 := b.register(t, registrytest.Spec("p1", registry.RolePrefill))
	elsewhere := registrytest.Spec("d-other-model", registry.RoleDecode)
	elsewhere.Model = "another-model"
	dx := b.register(t, elsewhere)
	id, did := p["id"].(string), d["id"].(string)
	own, other := b.cred(id), b.cred(did)
	hb := map[string]any{"instance_id": "inst-p0"}
	report := map[string]any{"reason": "r", "agent_name": "p0-agent-0"}
	for _, tc := range []struct {
		name, method, path, token string
		body                      any
		want                      int
	}{
		{"reads are open", "GET", "/api/v1/peers", "", nil, 200},
		{"pairs are open", "GET", "/api/v1/pairs", "", nil, 200},
		{"anonymous heartbeat", "POST", "/api/v1/peers/" + id + "/heartbeat", "", hb, 401},
		{"join token heartbeat", "POST", "/api/v1/peers/" + id + "/heartbeat", joinToken, hb, 403},
		{"another peer's heartbeat", "POST", "/api/v1/peers/" + id + "/heartbeat", other, hb, 403},
		{"forged credential", "POST", "/api/v1/peers/" + id + "/heartbeat", "pdpc." + id + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", hb, 401},
		{"own heartbeat", "POST", "/api/v1/peers/" + id + "/heartbeat", own, hb, 200},
		{"admin heartbeat", "POST", "/api/v1/peers/" + id + "/heartbeat", adminToken, hb, 200},
		{"anonymous full registration", "GET", "/api/v1/peers/" + id + "/registration", "", nil, 401},
		{"join token full registration", "GET", "/api/v1/peers/" + id + "/registration", joinToken, nil, 403},
		{"a decode reads a prefill's registration", "GET", "/api/v1/peers/" + id + "/registration", other, nil, 200},
		{"a prefill reads its own registration", "GET", "/api/v1/peers/" + id + "/registration", own, nil, 200},
		{"a prefill reads another prefill's registration", "GET", "/api/v1/peers/" + id + "/registration", b.cred(p1["id"].(string)), nil, 403},
		{"a decode of another model reads a prefill's registration", "GET", "/api/v1/peers/" + id + "/registration", b.cred(dx["id"].(string)), nil, 403},
		{"plain stale mark of another peer", "POST", "/api/v1/peers/" + id + "/stale", other, map[string]any{"reason": "r"}, 403},
		{"report in another prefill's name", "POST", "/api/v1/peers/" + id + "/stale", other, map[string]any{"reason": "r", "agent_name": "p0-agent-0", "prefill_id": id}, 403},
		{"join token stale report", "POST", "/api/v1/peers/" + id + "/stale", joinToken, report, 403},
		{"anonymous stale report", "POST", "/api/v1/peers/" + id + "/stale", "", report, 401},
		{"a decode reports a prefill, a pair it is no party to (issue 31)", "POST", "/api/v1/peers/" + id + "/stale", other, report, 403},
		{"another peer's credential drain", "POST", "/api/v1/peers/" + id + "/drain", other, nil, 403},
		{"own credential drain (an engine going away)", "POST", "/api/v1/peers/" + id + "/drain", own, nil, 200},
		{"join token drain", "POST", "/api/v1/peers/" + id + "/drain", joinToken, nil, 403},
		{"admin drain", "POST", "/api/v1/peers/" + id + "/drain", adminToken, nil, 200},
		{"peer credential delete", "DELETE", "/api/v1/peers/" + id, own, nil, 403},
		{"admin delete", "DELETE", "/api/v1/peers/" + id, adminToken, nil, 204},
		{"admin delete again", "DELETE", "/api/v1/peers/" + id, adminToken, nil, 404},
	} {
		code, out, hdr := b.do(t, tc.method, tc.path, tc.token, tc.body)
		if code != tc.want {
			t.Errorf("%s: %s %s: %d, want %d (%v)", tc.name, tc.method, tc.path, code, tc.want, out)
			continue
		}
		if code == 401 || code == 403 {
			if out["field"] != "Authorization" && out["field"] != "prefill_id" {
				t.Errorf("%s: problem names field %v", tc.name, out["field"])
			}
			if (code == 401) != (hdr.Get("WWW-Authenticate") != "") {
				t.Errorf("%s: %d with WWW-Authenticate %q", tc.name, code, hdr.Get("WWW-Authenticate"))
			}
		}
	}
}

// TestRegistrationCredentials pins who may register what: anonymous callers
// nothing, join tokens (old and new during a rotation) new names, and no
// credential another peer's name.
func TestRegistrationCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d0 := registrytest.Spec("d0", registry.RoleDecode)
	if code, out, _ := b.do(t, "POST", "/api/v1/peers", "", d0); code != 401 || out["field"] != "Authorization" {
		t.Fatalf("anonymous registration: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "POST", "/api/v1/peers", oldJoin, registrytest.Spec("p0", registry.RolePrefill)); code != 201 || out["credential"] == nil {
		t.Fatalf("registration with the join token being rotated out: %d %v", code, out)
	}
	d := b.register(t, d0)
	p := b.register(t, registrytest.Spec("p1", registry.RolePrefill))
	dCred, pCred := b.cred(d["id"].(string)), b.cred(p["id"].(string))

	hijack := d0
	hijack.URL = "http://10.6.6.6:30000"
	hijack.Ranks = slices.Clone(d0.Ranks)
	hijack.Ranks[0].AgentName = "evil-agent"
	for name, token := range map[string]string{"another peer's credential": pCred, "a join token": joinToken} {
		code, out, _ := b.do(t, "POST", "/api/v1/peers", token, hijack)
		if code != 403 || out["field"] != "Authorization" || !strings.Contains(out["detail"].(string), "held by another agent") {
			t.Errorf("re-registering d0 with %s: %d %v", name, code, out)
		}
	}
	got, err := b.store.Get(context.Background(), d["id"].(string))
	if err != nil || got.URL != d0.URL || got.Ranks[0].AgentName != d0.Ranks[0].AgentName {
		t.Fatalf("a refused re-registration changed d0: %+v %v", got.PeerSpec, err)
	}
	if code, out, _ := b.do(t, "POST", "/api/v1/peers", dCred, d0); code != 200 || out["credential"] != nil {
		t.Fatalf("re-registration with its own credential: %d %v", code, out)
	}
}

// TestStaleReportsAreRateLimited pins that one peer reporting others stale
// is held to its burst, that the limit is per reporter, and that the
// event names the reporter.
func TestStaleReportsAreRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reporter := b.register(t, registrytest.Spec("p0", registry.RolePrefill))
	second := b.register(t, registrytest.Spec("p1", registry.RolePrefill))
	d := b.register(t, registrytest.Spec("d0", registry.RoleDecode))
	did := d["id"].(string)
	report := map[string]any{"reason": "KV transfer failed", "agent_name": "d0-agent-0", "prefill_id": reporter["id"]}
	const burst = 20 // server.Config's default
	for i := 0; i < burst; i++ {
		if code, out, _ := b.do(t, "POST", "/api/v1/peers/"+did+"/stale", b.cred(reporter["id"].(string)), report); code != 200 {
			t.Fatalf("report %d: %d %v", i, code, out)
		}
	}
	code, out, hdr := b.do(t, "POST", "/api/v1/peers/"+did+"/stale", b.cred(reporter["id"].(string)), report)
	if code != 429 || out["type"] != server.ProblemRateLimited || hdr.Get("Retry-After") == "" {
		t.Fatalf("report past the burst: %d %v (Retry-After %q)", code, out, hdr.Get("Retry-After"))
	}
	other := map[string]any{"reason": "KV transfer failed", "agent_name": "d0-agent-0", "prefill_id": second["id"]}
	if code, out, _ := b.do(t, "POST", "/api/v1/peers/"+did+"/stale", b.cred(second["id"].(string)), other); code != 200 {
		t.Fatalf("another reporter is limited by the first one's reports: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "POST", "/api/v1/peers/"+did+"/stale", adminToken, report); code != 200 {
		t.Fatalf("the admin is limited: %d %v", code, out)
	}
	evs, err := b.store.Events(context.Background(), registry.EventQuery{PeerID: did, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		if e.Kind == registry.EventStale && strings.Contains(e.Message, "reported by p0") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no stale event names the reporter p0: %+v", evs)
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
	code, st, _ := b.do(t, "POST", "/api/v1/peers/"+id+"/stale", b.cred(id),
		map[string]any{"reason": "transfer failed", "error": "RuntimeError: Missing NIXL destination KV memory kind"})
	if code != 200 || st["state"] != "stale" || st["state_reason"] != "transfer failed (reported by d0)" {
		t.Fatalf("stale: %d %v", code, st)
	}
	// The stale mark starts a heal plan; an idle engine's heartbeat is told
	// to heal, once.
	if st["heal"].(map[string]any)["phase"] != "draining" {
		t.Fatalf("stale peer without a heal plan: %v", st)
	}
	if hb := b.heartbeat(t, id, spec.InstanceID); hb["action"] != "heal" || hb["reason"] != "transfer failed (reported by d0)" {
		t.Fatalf("heartbeat after stale: %v, want heal", hb)
	}
	if hb := b.heartbeat(t, id, spec.InstanceID); hb["action"] != "none" {
		t.Fatalf("second heartbeat after stale: %v, want none", hb)
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
	} {
		code, out, _ := b.do(t, "POST", tc.path, b.cred(id), tc.body)
		if code != tc.want || (tc.fld != "" && out["field"] != tc.fld) {
			t.Errorf("POST %s %v: %d %v, want %d field %q", tc.path, tc.body, code, out, tc.want, tc.fld)
		}
	}
	for _, tc := range []struct {
		path string
		body any
		want int
		fld  string
	}{
		{"/api/v1/peers/00000000-0000-4000-8000-000000000000/heartbeat", map[string]any{"instance_id": "x"}, 404, ""},
	} {
		code, out, _ := b.do(t, "POST", tc.path, adminToken, tc.body)
		if code != tc.want || (tc.fld != "" && out["field"] != tc.fld) {
			t.Errorf("POST %s %v: %d %v, want %d field %q", tc.path, tc.body, code, out, tc.want, tc.fld)
		}
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
		code, _, data := b.raw(t, http.MethodGet, path, "")
		return code, string(data)
	}
	pf, dv := registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode)
	p, d := b.register(t, pf), b.register(t, dv)
	b.heartbeat(t, p["id"].(string), pf.InstanceID)
	b.heartbeat(t, d["id"].(string), dv.InstanceID)
	simtest.WaitFor(t, "a routable pair", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })

	hbPath := "/api/v1/peers/" + d["id"].(string) + "/heartbeat"
	code, out, _ := b.do(t, "POST", hbPath, b.cred(d["id"].(string)), map[string]any{
		"instance_id": dv.InstanceID, "engine_healthy": false, "engine_error": "GET /health: connection refused"})
	if code != 200 || out["state"] != "unhealthy" || out["action"] != "none" {
		t.Fatalf("heartbeat with the engine down: %d %v", code, out)
	}
	simtest.WaitFor(t, "the decode out of routing", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return !ok })
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
	simtest.WaitFor(t, "the decode back in routing", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })

	for _, tc := range []struct {
		body map[string]any
		fld  string
	}{
		{map[string]any{"instance_id": dv.InstanceID, "engine_error": "boom"}, "engine_error"},
		{map[string]any{"instance_id": dv.InstanceID, "engine_healthy": false, "engine_error": "a\nb"}, "engine_error"},
		{map[string]any{"instance_id": dv.InstanceID, "engine_healthy": false, "engine_error": strings.Repeat("x", registry.MaxEngineErrorLen+1)}, "engine_error"},
		{map[string]any{"instance_id": dv.InstanceID, "load": map[string]any{"running": 0, "queued": 0, "kv_usage": 1.5}}, "load.kv_usage"},
	} {
		code, out, _ := b.do(t, "POST", hbPath, b.cred(d["id"].(string)), tc.body)
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
		code, _, data := b.raw(t, http.MethodGet, path, "")
		return code, string(data)
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
	simtest.WaitFor(t, "three ready peers in the snapshot", func() bool {
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

// TestSummaryHidesTheKeysToKVMemory pins that anonymous reads carry no KV
// pointer, agent metadata or transfer secret (only sizes, counts and
// kinds), and that the full registration goes to peer credentials and the
// admin only.
func TestSummaryHidesTheKeysToKVMemory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := registrytest.Spec("d0", registry.RoleDecode)
	spec.Ranks[0].TransferSecret = []byte("0123456789abcdef0123456789abcdef")
	spec.Ranks[0].AgentMetadata = bytes.Repeat([]byte{0xab}, 4096)
	spec.Ranks[0].AuxDataPtrs, spec.Ranks[0].AuxDataLens = []uint64{0x7f0002000000}, []uint64{64}
	d := b.register(t, spec)
	p := b.register(t, registrytest.Spec("p0", registry.RolePrefill))
	id := d["id"].(string)

	secret := base64.StdEncoding.EncodeToString(spec.Ranks[0].TransferSecret)
	forbidden := []string{"kv_data_ptrs", "aux_data_ptrs", "agent_metadata\"", "transfer_secret", "credential", secret}
	for _, path := range []string{"/api/v1/peers", "/api/v1/peers/" + id} {
		resp, err := http.Get(b.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, f := range forbidden {
			if strings.Contains(string(body), f) {
				t.Errorf("GET %s carries %q:\n%s", path, f, body)
			}
		}
	}
	// However large the NIXL metadata, the list stays small: the status
	// page polls it.
	big := registrytest.Spec("d1", registry.RoleDecode)
	big.Ranks[0].AgentMetadata = bytes.Repeat([]byte{0xcd}, registry.MaxAgentMetadata)
	b.register(t, big)
	resp, err := http.Get(b.url + "/api/v1/peers")
	if err != nil {
		t.Fatal(err)
	}
	list, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(list) > 16<<10 {
		t.Fatalf("GET /api/v1/peers of 3 peers, one with 4 MiB of agent metadata, is %d bytes", len(list))
	}
	t.Logf("GET /api/v1/peers: %d bytes for 3 peers carrying %d bytes of agent metadata", len(list), 4<<20+4096+len("meta-p0"))

	_, one, _ := b.do(t, "GET", "/api/v1/peers/"+id, "", nil)
	r0 := one["ranks"].([]any)[0].(map[string]any)
	for k, want := range map[string]any{"regions": 2.0, "kv_bytes": float64(2 << 20), "agent_metadata_bytes": 4096.0, "aux_regions": 1.0} {
		if r0[k] != want {
			t.Errorf("summary %s = %v, want %v", k, r0[k], want)
		}
	}
	if !reflect.DeepEqual(r0["kv_mem_kinds"], []any{"VRAM", "VRAM"}) {
		t.Errorf("summary kinds = %v", r0["kv_mem_kinds"])
	}

	for name, token := range map[string]string{"another peer": b.cred(p["id"].(string)), "the admin": adminToken, "the peer itself": b.cred(id)} {
		code, full, _ := b.do(t, "GET", "/api/v1/peers/"+id+"/registration", token, nil)
		if code != 200 {
			t.Fatalf("registration for %s: %d %v", name, code, full)
		}
		fr := full["ranks"].([]any)[0].(map[string]any)
		if fr["transfer_secret"] != secret || fr["kv_data_ptrs"] == nil || fr["agent_metadata"] == nil || full["credential"] != nil {
			t.Errorf("registration for %s: rank %v, credential %v", name, fr, full["credential"])
		}
	}
}

// TestEventsEmptyPeerIDIsRefused pins a disagreement the spec fuzzer found:
// openapi.yaml says peer_id is a UUID, while an empty one listed every
// peer's events.
func TestEventsEmptyPeerIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	code, out, _ := b.do(t, "GET", "/api/v1/events?peer_id=", "", nil)
	if code != http.StatusBadRequest || out["field"] != "peer_id" {
		t.Fatalf("GET /api/v1/events?peer_id=: %d %v, want 400 naming peer_id", code, out)
	}
	if code, _, _ := b.do(t, "GET", "/api/v1/events", "", nil); code != http.StatusOK {
		t.Fatalf("GET /api/v1/events without peer_id: %d, want 200", code)
	}
}

// TestRegistrationRefusesMetadataAndLinkLocal: a registration is an
// instruction to every router and prefill to dial its url and
// bootstrap_host, so addresses no engine listens on are refused, naming
// the field, and nothing is stored.
func TestRegistrationRefusesMetadataAndLinkLocal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ url, boot, field string }{
		{"http://169.254.169.254/latest/meta-data/", "", "url"},
		{"http://[fe80::1]:30000", "", "url"},
		{"http://0.0.0.0:30000", "", "url"},
		{"http://metadata.google.internal/", "", "url"},
		{"http://127.0.0.1:30000", "169.254.169.254", "bootstrap_host"},
	} {
		spec := registrytest.Spec("d0", registry.RoleDecode)
		spec.URL, spec.BootstrapHost = tc.url, tc.boot
		code, out, _ := b.do(t, "POST", "/api/v1/peers", joinToken, spec)
		if code != http.StatusUnprocessableEntity || out["field"] != tc.field {
			t.Errorf("register with url %s, bootstrap_host %q: %d %v, want 422 naming %s", tc.url, tc.boot, code, out, tc.field)
		}
	}
	if peers, err := b.store.List(context.Background(), registry.Filter{}); err != nil || len(peers) != 0 {
		t.Fatalf("refused registrations stored %d peers (%v)", len(peers), err)
	}
}

// TestAPIRequestsCounted: pdplane_api_requests_total counts each request by
// its route pattern and status code, a request no route matched as
// "unmatched", and keeps counting on the series it resolved first.
func TestAPIRequestsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		if code, _, _ := b.raw(t, http.MethodGet, "/healthz", ""); code != 200 {
			t.Fatalf("healthz: %d", code)
		}
	}
	if code, _, _ := b.raw(t, http.MethodGet, "/api/v1/peers/nope", ""); code != 404 {
		t.Fatalf("a missing peer: %d", code)
	}
	if code, _, _ := b.raw(t, http.MethodGet, "/no/such/page", ""); code != 404 {
		t.Fatalf("no route: %d", code)
	}
	_, _, data := b.raw(t, http.MethodGet, "/metrics", "")
	for _, want := range []string{
		`pdplane_api_requests_total{code="200",route="/healthz"} 3`,
		`pdplane_api_requests_total{code="404",route="/api/v1/peers/{id}"} 1`,
		`pdplane_api_requests_total{code="404",route="unmatched"} 1`,
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
