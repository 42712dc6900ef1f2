//go:build linux

package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim/simtest"
)

// The table of authority: what every operation of openapi.yaml answers to
// each kind of caller, on a control plane with an admin token, a join
// token and a client API key. docs/security.md says the same in words.
//
// The callers: anon (no Authorization), join (the join token), key (a
// client API key), admin (the admin token), and four peer credentials,
// named by what their peer is to the operation's target peer T: self (T),
// partner (the other half of T's PD split, same model), sibling (T's role,
// same model) and stranger (the other role, another model). Operations on
// a peer are tried on a prefill T and on a decode T; the pair operations
// name the pair (p0, d0), whichever T is.
//
// A row is "caller=status ..." for T a prefill, then " | ", then the same
// for T a decode; a row without " | " holds for both. The status is the
// exact answer: 2xx where the caller may, 4xx where it may not.
var authorityTable = map[string]string{
	"POST /api/v1/peers": "anon=401 join=403 key=401 admin=200 self=200 partner=403 sibling=403 stranger=403",
	"GET /api/v1/peers":  "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",

	"GET /api/v1/peers/{id}":    "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"DELETE /api/v1/peers/{id}": "anon=401 join=403 key=401 admin=204 self=403 partner=403 sibling=403 stranger=403",
	// A peer reads its own registration and those of its partners: its
	// transfer agent connects to them.
	"GET /api/v1/peers/{id}/registration": "anon=401 join=403 key=401 admin=200 self=200 partner=200 sibling=403 stranger=403",
	// A peer drains itself when it is going away (a pod's preStop).
	"POST /api/v1/peers/{id}/drain":     "anon=401 join=403 key=401 admin=200 self=200 partner=403 sibling=403 stranger=403",
	"GET /api/v1/peers/{id}/drain":      "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"POST /api/v1/peers/{id}/heartbeat": "anon=401 join=403 key=401 admin=200 self=200 partner=403 sibling=403 stranger=403",
	// A peer reports itself; a prefill reports the decodes it pairs with.
	"POST /api/v1/peers/{id}/stale": "anon=401 join=403 key=401 admin=200 self=200 partner=403 sibling=403 stranger=403" +
		" | anon=401 join=403 key=401 admin=200 self=200 partner=200 sibling=403 stranger=403",
	"PUT /api/v1/peers/{id}/probe": "anon=401 join=403 key=401 admin=200 self=200 partner=403 sibling=403 stranger=403",
	"GET /api/v1/peers/{id}/probe": "anon=401 join=403 key=401 admin=200 self=200 partner=200 sibling=403 stranger=403",

	"GET /api/v1/pairs":        "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"GET /api/v1/pairs/groups": "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"GET /api/v1/fleet":        "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",
	// The prefill of the pair reports its preflight: with T the prefill,
	// that is self; with T the decode, the partner.
	"PUT /api/v1/pairs/{prefill}/{decode}/preflight": "anon=401 join=403 key=401 admin=200 self=200 partner=403 sibling=403 stranger=403" +
		" | anon=401 join=403 key=401 admin=200 self=403 partner=200 sibling=403 stranger=403",
	"DELETE /api/v1/pairs/{prefill}/{decode}/quarantine": "anon=401 join=403 key=401 admin=404 self=403 partner=403 sibling=403 stranger=403",

	"GET /api/v1/events":        "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"GET /api/v1/events/stream": "anon=200 join=200 key=401 admin=200 self=200 partner=200 sibling=200 stranger=200",

	// The generation routes take client API keys only: no token of the
	// control plane spends the fleet. The bodies are bad on purpose (400):
	// the test asks who gets past the key, not for a generation.
	"POST /v1/chat/completions": "anon=401 join=401 key=400 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"POST /v1/completions":      "anon=401 join=401 key=400 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"POST /generate":            "anon=401 join=401 key=400 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"GET /v1/models":            "anon=401 join=401 key=200 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"GET /server_info":          "anon=401 join=401 key=200 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"GET /get_server_info":      "anon=401 join=401 key=200 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"GET /model_info":           "anon=401 join=401 key=200 admin=401 self=401 partner=401 sibling=401 stranger=401",
	"GET /get_model_info":       "anon=401 join=401 key=200 admin=401 self=401 partner=401 sibling=401 stranger=401",

	"GET /health":  "anon=200 join=200 key=200 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"GET /healthz": "anon=200 join=200 key=200 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"GET /readyz":  "anon=200 join=200 key=200 admin=200 self=200 partner=200 sibling=200 stranger=200",
	"GET /metrics": "anon=200 join=200 key=200 admin=200 self=200 partner=200 sibling=200 stranger=200",
}

// callers are the table's columns, in its order.
var callers = []string{"anon", "join", "key", "admin", "self", "partner", "sibling", "stranger"}

const clientKey = "client-api-key"

// authorityFleet is a control plane (with the router's routes) and six
// ready peers: two prefills and two decodes of model m, a prefill and a
// decode of another model. T is p0 or d0; each has published a probe.
type authorityFleet struct {
	*bundle
	specs map[string]registry.PeerSpec
}

func newAuthorityFleet(t *testing.T) *authorityFleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.Disabled)
	store := memstore.New(memstore.Config{})
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rt, err := router.New(router.Config{APIKeys: []string{clientKey}}, mirror, store, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{AdminToken: adminToken, JoinTokens: []string{joinToken}},
		server.Deps{Store: store, Snaps: mirror, Registry: reg, Routes: rt}, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	f := &authorityFleet{
		bundle: &bundle{url: ts.URL, store: store, mirror: mirror, reg: reg, srv: srv, creds: map[string]string{}, ids: map[string]string{}},
		specs:  map[string]registry.PeerSpec{},
	}
	for name, role := range map[string]registry.Role{"p0": registry.RolePrefill, "p1": registry.RolePrefill, "px": registry.RolePrefill,
		"d0": registry.RoleDecode, "d1": registry.RoleDecode, "dx": registry.RoleDecode} {
		spec := registrytest.Spec(name, role)
		if strings.HasSuffix(name, "x") {
			spec.Model = "another-model"
		}
		f.specs[name] = spec
		f.ready(t, spec)
	}
	for _, name := range []string{"p0", "d0"} {
		probe := map[string]any{"agent_name": name + "-probe", "backend": "tcp", "mem_kind": "DRAM", "metadata": "bWQ=",
			"addr": uint64(1)<<63 + 4096, "len": 2 << 20, "transfer_secret": "MDEyMzQ1Njc4OWFiY2RlZg=="}
		if code, out, _ := f.do(t, "PUT", "/api/v1/peers/"+f.ids[name]+"/probe", f.cred(f.ids[name]), probe); code != 200 {
			t.Fatalf("publish %s's probe: %d %v", name, code, out)
		}
	}
	simtest.WaitFor(t, "the pairs in the routing snapshot", func() bool {
		r := mirror.Snapshot().Routes("m")
		return r != nil && len(r.DecodesFor(f.ids["p0"])) == 2
	})
	return f
}

// callerPeer names the peer a peer caller is, for target T.
func callerPeer(target, caller string) string {
	prefill := target == "p0"
	switch caller {
	case "self":
		return target
	case "partner":
		return map[bool]string{true: "d0", false: "p0"}[prefill]
	case "sibling":
		return map[bool]string{true: "p1", false: "d1"}[prefill]
	case "stranger":
		return map[bool]string{true: "dx", false: "px"}[prefill]
	}
	return ""
}

// token is the bearer the caller presents ("" for anon).
func (f *authorityFleet) token(target, caller string) string {
	switch caller {
	case "anon":
		return ""
	case "join":
		return joinToken
	case "key":
		return clientKey
	case "admin":
		return adminToken
	}
	return f.cred(f.ids[callerPeer(target, caller)])
}

// request is what the test sends for operation op (METHOD path-pattern)
// with target T, by caller: a valid request wherever one is possible, so
// that only authority decides the answer.
func (f *authorityFleet) request(op, target, caller string) (method, path string, body any) {
	method, pattern, _ := strings.Cut(op, " ")
	t := f.specs[target]
	path = strings.NewReplacer("{id}", f.ids[target], "{prefill}", f.ids["p0"], "{decode}", f.ids["d0"]).Replace(pattern)
	switch op {
	case "POST /api/v1/peers":
		body = t // T re-registers as it is
	case "POST /api/v1/peers/{id}/heartbeat":
		body = map[string]any{"instance_id": t.InstanceID}
	case "POST /api/v1/peers/{id}/stale":
		report := map[string]any{"reason": "KV transfer failed: Missing NIXL destination KV memory kind", "agent_name": t.Ranks[0].AgentName}
		if p := callerPeer(target, caller); p != "" {
			report["prefill_id"] = f.ids[p] // a peer reports as itself
		}
		body = report
	case "PUT /api/v1/peers/{id}/probe":
		body = map[string]any{"agent_name": target + "-probe-2", "backend": "tcp", "mem_kind": "DRAM", "metadata": "bWQ=",
			"addr": uint64(1)<<63 + 4096, "len": 2 << 20}
	case "PUT /api/v1/pairs/{prefill}/{decode}/preflight":
		body = map[string]any{"state": "passed", "backend": "tcp", "mem_kind": "DRAM", "gbps": 1.5, "latency_us": 80,
			"checked_at": "2026-12-01T10:00:00Z"}
	case "POST /v1/chat/completions", "POST /v1/completions", "POST /generate":
		body = `{"model": 7}`
	}
	return method, path, body
}

// expected parses a table row into its two halves: T a prefill, T a decode.
func expected(t *testing.T, op, row string) map[string]map[string]int {
	t.Helper()
	halves := strings.Split(row, " | ")
	if len(halves) == 1 {
		halves = append(halves, halves[0])
	}
	out := map[string]map[string]int{}
	for i, target := range []string{"p0", "d0"} {
		out[target] = map[string]int{}
		for _, cell := range strings.Fields(halves[i]) {
			caller, status, _ := strings.Cut(cell, "=")
			code, err := strconv.Atoi(status)
			if err != nil || !slices.Contains(callers, caller) {
				t.Fatalf("%s: bad cell %q", op, cell)
			}
			out[target][caller] = code
		}
		if len(out[target]) != len(callers) {
			t.Fatalf("%s: %d callers for T=%s, want %d", op, len(out[target]), target, len(callers))
		}
	}
	return out
}

// TestAuthorityTable tries every operation of openapi.yaml with every kind
// of caller and checks the answer against authorityTable. An operation the
// spec has and the table lacks, or the other way round, fails the test:
// a new route cannot go untried. Each cell runs on a fleet of its own, so
// that a delete or a stale mark does not change the next cell's answer.
func TestAuthorityTable(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	var ops []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, method+" "+path)
		}
	}
	slices.Sort(ops)
	for _, op := range ops {
		if _, ok := authorityTable[op]; !ok {
			t.Errorf("openapi.yaml's %s has no row in the authority table", op)
		}
	}
	for op := range authorityTable {
		if !slices.Contains(ops, op) {
			t.Errorf("the authority table's %s is no operation of openapi.yaml", op)
		}
	}
	for _, op := range ops {
		row, ok := authorityTable[op]
		if !ok {
			continue
		}
		want := expected(t, op, row)
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			for _, target := range []string{"p0", "d0"} {
				for _, caller := range callers {
					f := newAuthorityFleet(t)
					method, path, body := f.request(op, target, caller)
					code := f.status(t, method, path, f.token(target, caller), body)
					if code != want[target][caller] {
						t.Errorf("T=%s, %s: %s %s answered %d, want %d", target, caller, method, path, code, want[target][caller])
					}
				}
			}
		})
	}
}

// status sends the request and returns its status, without waiting for
// the body of an answer that streams.
func (f *authorityFleet) status(t *testing.T, method, path, token string, body any) int {
	t.Helper()
	if !strings.HasSuffix(path, "/stream") {
		code, _, _ := f.do(t, method, path, token, body)
		return code
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, f.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(fmt.Errorf("%s %s: %w", method, path, err))
	}
	resp.Body.Close()
	return resp.StatusCode
}
