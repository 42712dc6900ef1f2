package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
)

// serveStore starts the control plane over store, as setup does over the
// embedded store, and returns its URL and routing mirror.
func serveStore(t testing.TB, store registry.Store) (string, *replica.Mirror) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.Nop() // a fuzz target may not log through its *testing.F
	if tt, ok := t.(*testing.T); ok {
		log = zerolog.New(zerolog.NewTestWriter(tt)).Level(zerolog.WarnLevel)
	}
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{AdminToken: adminToken, JoinTokens: []string{joinToken}, MaxBodyBytes: 8 << 20},
		server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL, mirror
}

// bothStores runs fn once over the embedded store and once over PostgreSQL.
func bothStores(t *testing.T, fn func(t *testing.T, store registry.Store)) {
	t.Run("memstore", func(t *testing.T) {
		t.Parallel()
		fn(t, memstore.New(memstore.Config{}))
	})
	t.Run("pgstore", func(t *testing.T) {
		t.Parallel()
		s, _ := registrytest.NewPGStore(t, pgstore.Config{})
		fn(t, s)
	})
}

// answer is what a request got, reduced to what both stores must agree on.
type answer struct {
	Status int
	Body   any
}

// sendRaw makes one request; body is sent as is.
func sendRaw(t testing.TB, base, method, path string, header http.Header, body []byte) answer {
	t.Helper()
	resp := adminRequest(t, context.Background(), base, method, path, header, body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %q: read answer: %v", method, path, err)
	}
	a := answer{Status: resp.StatusCode}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &a.Body); err != nil {
			t.Fatalf("%s %q: %d answer is not JSON: %v\n%s", method, path, resp.StatusCode, err, data)
		}
	}
	return a
}

// adminRequest sends one request as the admin, with header added and body
// (none when nil) sent as is, as JSON. The caller closes the answer's body.
func adminRequest(t testing.TB, ctx context.Context, base, method, path string, header http.Header, body []byte) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		t.Fatalf("%s %q: %v", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %q: %v", method, path, err)
	}
	return resp
}

// storeNeutral drops what legitimately differs between two stores holding the
// same peers: ids, credentials and timestamps (kept only as present or not).
func storeNeutral(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, val := range x {
			switch k {
			case "id", "peer_id", "next_cursor", "credential":
				out[k] = "<id>"
			case "created_at", "updated_at", "lease_expiry", "last_heartbeat", "at", "started", "acted", "deadline":
				out[k] = "<time>"
			case "pairs": // a heal plan's prefill ids
				ids, _ := val.([]any)
				out[k] = len(ids)
			default:
				out[k] = storeNeutral(val)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = storeNeutral(x[i])
		}
		return out
	case string:
		return x
	}
	return v
}

// parityGen draws the random inputs: strings and numbers chosen to sit on the
// edges of the registry's limits and PostgreSQL's types.
type parityGen struct{ r *rand.Rand }

func (g parityGen) pick(n int) int { return g.r.IntN(n) }

func (g parityGen) str() string {
	switch g.pick(14) {
	case 0:
		return ""
	case 1:
		return "a\x00b"
	case 2:
		return "\x00"
	case 3:
		return "line\nbreak"
	case 4:
		return "c1\u0085"
	case 5:
		return "bad\xff\xfeutf8"
	case 6:
		return "\xc3"
	case 7:
		return strings.Repeat("n", registry.MaxNameLen)
	case 8:
		return strings.Repeat("名", registry.MaxNameLen+g.pick(2))
	case 9:
		return strings.Repeat("x", 256+g.pick(2))
	case 10:
		return strings.Repeat("e", 1024+g.pick(2))
	case 11:
		return " "
	case 12:
		return "<b>ok</b> \u2603"
	}
	return fmt.Sprintf("s%d", g.pick(4))
}

// num returns a JSON number literal around the int32 and int64 edges.
func (g parityGen) num() json.RawMessage {
	vals := []string{"-1", "0", "1", "2", "7", "65535", "65536",
		strconv.Itoa(math.MaxInt32), strconv.Itoa(math.MaxInt32 + 1), "4294967301",
		strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MinInt64, 10),
		"18446744073709551616", "1e20", "1.5", "-2147483649"}
	return json.RawMessage(vals[g.pick(len(vals))])
}

func (g parityGen) float() json.RawMessage {
	vals := []string{"0", "0.5", "1", "1.0000001", "-0.1", "1e308"}
	return json.RawMessage(vals[g.pick(len(vals))])
}

// encodeRaw writes v as JSON, but strings byte for byte: invalid UTF-8 reaches
// the server as it is instead of being replaced on the way.
func encodeRaw(buf *bytes.Buffer, v any) {
	switch x := v.(type) {
	case string:
		buf.WriteByte('"')
		for i := 0; i < len(x); i++ {
			c := x[i]
			switch {
			case c == '"' || c == '\\':
				buf.WriteByte('\\')
				buf.WriteByte(c)
			case c < 0x20:
				fmt.Fprintf(buf, `\u%04x`, c)
			default:
				buf.WriteByte(c)
			}
		}
		buf.WriteByte('"')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			encodeRaw(buf, k)
			buf.WriteByte(':')
			encodeRaw(buf, x[k])
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			encodeRaw(buf, x[i])
		}
		buf.WriteByte(']')
	default:
		data, _ := json.Marshal(x)
		buf.Write(data)
	}
}

func rawJSON(v any) []byte {
	var buf bytes.Buffer
	encodeRaw(&buf, v)
	return buf.Bytes()
}

// asMap turns a spec into the generic form that mutations edit.
func asMap(spec registry.PeerSpec) map[string]any {
	data := specJSON(spec)
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	return m
}

// specParts are a registration as a JSON map and the maps inside it that
// an edit reaches into: parallelism, kv and the first rank.
type specParts struct{ m, par, kv, rank map[string]any }

// specEdit sets one field of a registration to a random edge value.
type specEdit struct {
	field string
	set   func(g parityGen, s specParts)
}

// specEdits are every edit mutateSpec draws from, in the order it draws;
// the conformance walk draws from those its oracle covers (specEditsBut).
var specEdits = []specEdit{
	{"name", func(g parityGen, s specParts) { s.m["name"] = g.str() }},
	{"model", func(g parityGen, s specParts) { s.m["model"] = g.str() }},
	{"instance_id", func(g parityGen, s specParts) { s.m["instance_id"] = g.str() }},
	{"url", func(g parityGen, s specParts) { s.m["url"] = "http://" + g.str() }},
	{"bootstrap_host", func(g parityGen, s specParts) { s.m["bootstrap_host"] = g.str() }},
	{"bootstrap_port", func(g parityGen, s specParts) { s.m["bootstrap_port"] = g.num() }},
	{"transfer_group", func(g parityGen, s specParts) { s.m["transfer_group"] = g.str() }},
	{"labels", func(g parityGen, s specParts) { s.m["labels"] = map[string]any{g.str(): g.str()} }},
	{"labels.foo", func(g parityGen, s specParts) { s.m["labels"] = map[string]any{"foo": g.str()} }},
	{"parallelism.tp_size", func(g parityGen, s specParts) {
		s.par["tp_size"], s.par["attn_tp_size"] = g.num(), json.RawMessage("1")
	}},
	{"parallelism.pp_rank", func(g parityGen, s specParts) { s.par["pp_rank"] = g.num() }},
	{"kv.page_size", func(g parityGen, s specParts) { s.kv["page_size"] = g.num() }},
	{"kv.dtype", func(g parityGen, s specParts) { s.kv["dtype"] = g.str() }},
	{"ranks.rank", func(g parityGen, s specParts) { s.rank["rank"] = g.num() }},
	{"ranks.gpu_id", func(g parityGen, s specParts) { s.rank["gpu_id"] = g.num() }},
	{"ranks.agent_name", func(g parityGen, s specParts) { s.rank["agent_name"] = g.str() }},
	{"ranks.kv_data_ptrs", func(g parityGen, s specParts) {
		s.rank["kv_data_ptrs"] = []any{g.num(), json.RawMessage("140737488355328")}
	}},
}

// specEditsBut is specEdits, in order, without the edits of the fields
// named.
func specEditsBut(fields ...string) []specEdit {
	var out []specEdit
	for _, e := range specEdits {
		if !slices.Contains(fields, e.field) {
			out = append(out, e)
		}
	}
	return out
}

// mutateSpec sets one field of a registration to a random edge value.
func (g parityGen) mutateSpec(m map[string]any) { g.editSpec(m, specEdits) }

// editSpec applies one of edits, drawn at random, to the registration m.
func (g parityGen) editSpec(m map[string]any, edits []specEdit) {
	s := specParts{m: m, rank: m["ranks"].([]any)[0].(map[string]any),
		par: m["parallelism"].(map[string]any), kv: m["kv"].(map[string]any)}
	edits[g.pick(len(edits))].set(g, s)
}

// parityOp is one random request, sent alike to every server.
type parityOp struct {
	method, path string
	header       http.Header
	body         []byte
}

// peerRef stands for a peer in a request: a name whose id each server
// knows (its own), or a literal string.
type peerRef struct {
	name    string
	literal string
}

func (g parityGen) peerRef(names []string) peerRef {
	if len(names) > 0 && g.pick(4) > 0 {
		return peerRef{name: names[g.pick(len(names))]}
	}
	lits := []string{"6f1c3c55-1111-4222-8333-444455556666", "6F1C3C55-1111-4222-8333-444455556666", "not-a-uuid", "a\x00b", "\xff", ""}
	return peerRef{literal: lits[g.pick(len(lits))]}
}

// TestStoresAnswerAlike drives the control plane over the embedded store and
// over PostgreSQL with the same seeded random requests — registrations,
// heartbeats, stale reports, drains, removals, listings — full of NUL, control characters,
// invalid UTF-8, overlong strings and integers around the int32 and int64
// edges, and requires the same answer from both every time (status,
// problem type and field, the peer as stored) and the same peers at the end.
func TestStoresAnswerAlike(t *testing.T) {
	t.Parallel()
	const seed, iterations, budget = 20261201, 2000, 45 * time.Second
	mem, _ := serveStore(t, memstore.New(memstore.Config{}))
	pgs, _ := registrytest.NewPGStore(t, pgstore.Config{})
	pg, _ := serveStore(t, pgs)
	servers := []string{mem, pg}
	ids := []map[string]string{{}, {}} // per server: peer name → its id
	instances := map[string]string{}   // peer name → registered instance id
	var names []string
	g := parityGen{r: rand.New(rand.NewPCG(seed, seed))}
	resolve := func(i int, ref peerRef) string {
		if ref.name != "" {
			return ids[i][ref.name]
		}
		return ref.literal
	}
	deadline := time.Now().Add(budget)
	n := 0
	for ; n < iterations && time.Now().Before(deadline); n++ {
		var build func(i int) parityOp
		kind := g.pick(11)
		switch {
		case kind < 3: // register, usually with one field at an edge
			name := fmt.Sprintf("peer-%d", g.pick(4))
			role := []registry.Role{registry.RolePrefill, registry.RoleDecode}[g.pick(2)]
			m := asMap(registrytest.Spec(name, role))
			for k := g.pick(3); k > 0; k-- {
				g.mutateSpec(m)
			}
			b := rawJSON(m)
			build = func(int) parityOp { return parityOp{method: "POST", path: "/api/v1/peers", body: b} }
		case kind < 6: // heartbeat
			ref := g.peerRef(names)
			hb := map[string]any{"instance_id": instances[ref.name]}
			if g.pick(2) == 0 {
				hb["instance_id"] = g.str()
			}
			if g.pick(2) == 0 {
				hb["load"] = map[string]any{"running": g.num(), "queued": g.num(), "kv_usage": g.float()}
			}
			b := rawJSON(hb)
			build = func(i int) parityOp {
				return parityOp{method: "POST", path: "/api/v1/peers/" + url.PathEscape(resolve(i, ref)) + "/heartbeat", body: b}
			}
		case kind < 8: // stale mark or transfer report
			ref := g.peerRef(names)
			rep := map[string]any{"reason": g.str()}
			if g.pick(2) == 0 {
				rep["error"] = g.str()
			}
			if g.pick(3) == 0 {
				rep["agent_name"] = g.str()
			}
			var prefill *peerRef
			if g.pick(3) == 0 {
				p := g.peerRef(names)
				prefill = &p
			}
			build = func(i int) parityOp {
				r := map[string]any{}
				for k, v := range rep {
					r[k] = v
				}
				if prefill != nil {
					r["prefill_id"] = resolve(i, *prefill)
				}
				return parityOp{method: "POST", path: "/api/v1/peers/" + url.PathEscape(resolve(i, ref)) + "/stale", body: rawJSON(r)}
			}
		case kind < 9: // event page
			before := []string{"", "-1", "0", "1", "3", "9223372036854775807", "9223372036854775808", "x"}[g.pick(8)]
			ref := g.peerRef(names)
			usePeer := g.pick(2) == 0
			lastID := []string{"", "0", "-1", "abc", "5"}[g.pick(5)]
			stream := g.pick(4) == 0
			build = func(i int) parityOp {
				q := url.Values{}
				if before != "" {
					q.Set("before", before)
				}
				if usePeer {
					q.Set("peer_id", resolve(i, ref))
				}
				if stream {
					// Only refusals are compared: an accepted stream never ends.
					h := http.Header{}
					if lastID == "" || lastID == "5" || lastID == "0" {
						lastID = "-1"
					}
					h.Set("Last-Event-ID", lastID)
					return parityOp{method: "GET", path: "/api/v1/events/stream", header: h}
				}
				return parityOp{method: "GET", path: "/api/v1/events?" + q.Encode()}
			}
		case kind == 10 && g.pick(3) == 0: // an operator drains or removes a peer
			ref := g.peerRef(names)
			drain := g.pick(2) == 0
			build = func(i int) parityOp {
				if drain {
					return parityOp{method: "POST", path: "/api/v1/peers/" + url.PathEscape(resolve(i, ref)) + "/drain"}
				}
				return parityOp{method: "DELETE", path: "/api/v1/peers/" + url.PathEscape(resolve(i, ref))}
			}
		default: // peer listing or one peer
			model := g.str()
			ref := g.peerRef(names)
			one := g.pick(2) == 0
			build = func(i int) parityOp {
				if one {
					return parityOp{method: "GET", path: "/api/v1/peers/" + url.PathEscape(resolve(i, ref))}
				}
				return parityOp{method: "GET", path: "/api/v1/peers?model=" + url.QueryEscape(model)}
			}
		}
		var got [2]answer
		var ops [2]parityOp
		for i, base := range servers {
			ops[i] = build(i)
			got[i] = sendRaw(t, base, ops[i].method, ops[i].path, ops[i].header, ops[i].body)
		}
		if got[0].Status >= 500 || got[1].Status >= 500 {
			t.Fatalf("iteration %d: %s %q %q: a server error: memstore %d %v, pgstore %d %v",
				n, ops[0].method, ops[0].path, ops[0].body, got[0].Status, got[0].Body, got[1].Status, got[1].Body)
		}
		if !reflect.DeepEqual(storeNeutral(got[0].Body), storeNeutral(got[1].Body)) || got[0].Status != got[1].Status {
			t.Fatalf("iteration %d: %s %q %q: the stores disagree:\nmemstore %d %v\npgstore  %d %v",
				n, ops[0].method, ops[0].path, ops[0].body, got[0].Status, got[0].Body, got[1].Status, got[1].Body)
		}
		if ops[0].path == "/api/v1/peers" && ops[0].method == "POST" && got[0].Status < 300 {
			for i := range servers {
				p := got[i].Body.(map[string]any)
				name := p["name"].(string)
				if _, known := ids[i][name]; !known && i == 0 {
					names = append(names, name)
				}
				ids[i][name] = p["id"].(string)
				instances[name] = p["instance_id"].(string)
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d iterations in %s; the comparison says too little", n, budget)
	}
	final := [2]answer{sendRaw(t, mem, "GET", "/api/v1/peers", nil, nil), sendRaw(t, pg, "GET", "/api/v1/peers", nil, nil)}
	if !reflect.DeepEqual(storeNeutral(final[0].Body), storeNeutral(final[1].Body)) {
		t.Fatalf("after %d requests the stores hold different peers:\nmemstore %v\npgstore  %v", n, final[0].Body, final[1].Body)
	}
	t.Logf("%d random requests, %d peers, same answers from both stores", n, len(names))
}

// TestMalformedHeartbeatFloodKeepsOthersReady floods one decode with
// malformed heartbeats over HTTP while the rest of the fleet heartbeats as
// usual: on either store every malformed one is a 422 naming its field,
// every good one is answered, every other peer stays ready and /readyz
// stays 200.
func TestMalformedHeartbeatFloodKeepsOthersReady(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, store registry.Store) {
		base, mirror := serveStore(t, store)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		snaps := mirror.Watch(ctx)
		register := func(spec registry.PeerSpec) string {
			a := sendRaw(t, base, "POST", "/api/v1/peers", nil, rawJSON(asMap(spec)))
			if a.Status != http.StatusCreated {
				t.Fatalf("register %s: %d %v", spec.Name, a.Status, a.Body)
			}
			return a.Body.(map[string]any)["id"].(string)
		}
		victim := registrytest.Spec("victim", registry.RoleDecode)
		victimID := register(victim)
		fleet := registrytest.Fleet(8)
		fleetIDs := make([]string, len(fleet))
		for i, spec := range fleet {
			fleetIDs[i] = register(spec)
		}
		bad := []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"instance_id": victim.InstanceID + "\x00"}, "instance_id"},
			{map[string]any{"instance_id": "\xff\xfe"}, ""}, // decoded as U+FFFD: a valid, different instance
			{map[string]any{"instance_id": victim.InstanceID, "load": map[string]any{"running": json.RawMessage("4294967301"), "queued": 0, "kv_usage": 0}}, "load.running"},
			{map[string]any{"instance_id": ""}, "instance_id"},
			{map[string]any{"instance_id": victim.InstanceID, "load": map[string]any{"running": 0, "queued": -1, "kv_usage": 0}}, "load.queued"},
		}
		const flood, rounds = 300, 3
		var wg sync.WaitGroup
		errs := make(chan string, flood+rounds*len(fleet))
		start := make(chan struct{})
		for i := 0; i < flood; i++ {
			wg.Add(1)
			go func(b []byte, field string) {
				defer wg.Done()
				<-start
				a := sendRaw(t, base, "POST", "/api/v1/peers/"+victimID+"/heartbeat", nil, b)
				if field == "" {
					if a.Status != http.StatusOK || a.Body.(map[string]any)["action"] != "reregister" {
						errs <- fmt.Sprintf("heartbeat from another instance: %d %v, want reregister", a.Status, a.Body)
					}
					return
				}
				if p, _ := a.Body.(map[string]any); a.Status != http.StatusUnprocessableEntity || p["field"] != field {
					errs <- fmt.Sprintf("malformed heartbeat %q: %d %v, want 422 on %s", b, a.Status, a.Body, field)
				}
			}(rawJSON(bad[i%len(bad)].body), bad[i%len(bad)].field)
		}
		for r := 0; r < rounds; r++ {
			for i, spec := range fleet {
				wg.Add(1)
				go func(id, inst string) {
					defer wg.Done()
					<-start
					a := sendRaw(t, base, "POST", "/api/v1/peers/"+id+"/heartbeat", nil, rawJSON(map[string]any{"instance_id": inst}))
					if p, _ := a.Body.(map[string]any); a.Status != http.StatusOK || p["state"] != "ready" {
						errs <- fmt.Sprintf("good heartbeat of %s: %d %v", id, a.Status, a.Body)
					}
				}(fleetIDs[i], spec.InstanceID)
			}
		}
		close(start)
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		for i, id := range fleetIDs {
			a := sendRaw(t, base, "GET", "/api/v1/peers/"+id, nil, nil)
			if p, _ := a.Body.(map[string]any); a.Status != http.StatusOK || p["state"] != "ready" {
				t.Errorf("%s after the flood: %d %v, want ready", fleet[i].Name, a.Status, p["state"])
			}
		}
		// The routing snapshot follows the store: wait for it to hold the
		// whole fleet ready, then /readyz must say so.
		allReady := func(s *replica.Snapshot) bool {
			for _, id := range fleetIDs {
				if p, ok := s.Peer(id); !ok || p.State != registry.StateReady {
					return false
				}
			}
			return true
		}
		for s := mirror.Snapshot(); !allReady(s); {
			select {
			case s = <-snaps:
			case <-ctx.Done():
				t.Fatal("the routing snapshot never showed the fleet ready")
			}
		}
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/readyz after the flood: %d, want 200", resp.StatusCode)
		}
	})
}

// FuzzHeartbeatStoresAlike sends the same heartbeat body to the control
// plane over each store, for a peer registered alike in both, and requires
// the same answer and the same peer afterwards.
func FuzzHeartbeatStoresAlike(f *testing.F) {
	spec := registrytest.Spec("d0", registry.RoleDecode)
	for _, seed := range []string{
		`{"instance_id": "inst-d0", "load": {"running": 3, "queued": 1, "kv_usage": 0.25}}`,
		`{"instance_id": "inst-d0\u0000"}`,
		"{\"instance_id\": \"inst-d0\xff\"}",
		`{"instance_id": "inst-d0", "load": {"running": 4294967301, "queued": 0, "kv_usage": 0}}`,
		`{"instance_id": "inst-d0", "load": {"running": 0, "queued": -1, "kv_usage": 1.5}}`,
		`{"instance_id": ""}`,
		`{"instance_id": "other"}`,
		`{"instance_id": "inst-d0", "load": {"running": 1e40}}`,
		`[]`,
	} {
		f.Add([]byte(seed))
	}
	pgs, _ := registrytest.NewPGStore(f, pgstore.Config{})
	var bases, ids [2]string
	for i, store := range []registry.Store{memstore.New(memstore.Config{}), pgs} {
		bases[i], _ = serveStore(f, store)
		a := sendRaw(f, bases[i], "POST", "/api/v1/peers", nil, rawJSON(asMap(spec)))
		if a.Status != http.StatusCreated {
			f.Fatalf("register: %d %v", a.Status, a.Body)
		}
		ids[i] = a.Body.(map[string]any)["id"].(string)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got, after [2]answer
		for i := range bases {
			got[i] = sendRaw(t, bases[i], "POST", "/api/v1/peers/"+ids[i]+"/heartbeat", nil, b)
			after[i] = sendRaw(t, bases[i], "GET", "/api/v1/peers/"+ids[i], nil, nil)
		}
		if got[0].Status >= 500 || got[0].Status != got[1].Status || !reflect.DeepEqual(got[0].Body, got[1].Body) {
			t.Fatalf("heartbeat %q: memstore %d %v, pgstore %d %v", b, got[0].Status, got[0].Body, got[1].Status, got[1].Body)
		}
		if !reflect.DeepEqual(storeNeutral(after[0].Body), storeNeutral(after[1].Body)) {
			t.Fatalf("after heartbeat %q the peers differ:\nmemstore %v\npgstore  %v", b, after[0].Body, after[1].Body)
		}
	})
}
