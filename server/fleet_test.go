package server_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/server"
)

// fakeBreakers stands in for the router (outside the server's boundary):
// one peer's breaker is open, one pair's half-open, the rest closed.
type fakeBreakers struct {
	mu                        sync.Mutex
	openPeer, prefill, decode string
}

func (f *fakeBreakers) set(openPeer, prefill, decode string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.openPeer, f.prefill, f.decode = openPeer, prefill, decode
}

var openedAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (f *fakeBreakers) PeerBreaker(id string) (string, time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id == f.openPeer {
		return "open", openedAt, true
	}
	return "closed", time.Time{}, true
}

func (f *fakeBreakers) PairBreaker(p, d string) (string, time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p == f.prefill && d == f.decode {
		return "half_open", openedAt, true
	}
	return "", time.Time{}, false
}

func (*fakeBreakers) OpenBreakers() (int, int) { return 1, 1 }

func (*fakeBreakers) InFlight(string) int64 { return 0 }

// TestFleetSummaryGroupsAndBreakers reads what the status page reads: the
// fleet summary naming replica, store and version; the peer list without
// rank regions, with the router's breakers; the pair groups and a group's
// pairs.
func TestFleetSummaryGroupsAndBreakers(t *testing.T) {
	t.Parallel()
	var breakers fakeBreakers
	b := setupWith(t, func(c *server.Config, d *server.Deps) {
		c.Replica, c.StoreKind, c.Version = "replica-7", "postgres", "v1.2.3"
		d.Breakers = &breakers
	})
	p0 := b.register(t, registrytest.Spec("p0", registry.RolePrefill))["id"].(string)
	d0 := b.register(t, registrytest.Spec("d0", registry.RoleDecode))["id"].(string)
	breakers.set(p0, p0, d0)
	b.heartbeat(t, p0, "inst-p0")
	b.heartbeat(t, d0, "inst-d0")

	var fleet map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, out, _ := b.do(t, http.MethodGet, "/api/v1/fleet", "", nil)
		if code != http.StatusOK {
			t.Fatalf("GET fleet = %d %v", code, out)
		}
		fleet = out
		if out["by_state"].(map[string]any)["ready"] == float64(2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet summary never counted two ready peers: %v", out)
		}
		time.Sleep(10 * time.Millisecond) // the mirror takes the heartbeats in on its own schedule
	}
	pairs := fleet["pairs"].(map[string]any)
	if fleet["replica"] != "replica-7" || fleet["store"] != "postgres" || fleet["version"] != "v1.2.3" || fleet["peers"] != float64(2) ||
		pairs["total"] != float64(1) || pairs["routable"] != float64(1) || fleet["breakers"].(map[string]any)["peers_open"] != float64(1) {
		t.Errorf("fleet summary = %v", fleet)
	}

	_, list, _ := b.do(t, http.MethodGet, "/api/v1/peers?view=summary", "", nil)
	for _, p := range list["peers"].([]any) {
		peer := p.(map[string]any)
		if _, ok := peer["ranks"]; ok {
			t.Errorf("view=summary lists %s's ranks", peer["name"])
		}
		want := map[string]string{p0: "open", d0: "closed"}[peer["id"].(string)]
		if got := peer["breaker"].(map[string]any)["state"]; got != want {
			t.Errorf("%s's breaker = %v, want %s", peer["name"], got, want)
		}
	}
	_, full, _ := b.do(t, http.MethodGet, "/api/v1/peers", "", nil)
	if _, ok := full["peers"].([]any)[0].(map[string]any)["ranks"]; !ok {
		t.Error("the default view lost the ranks")
	}
	if code, out, _ := b.do(t, http.MethodGet, "/api/v1/peers?view=bogus", "", nil); code != http.StatusBadRequest || out["field"] != "view" {
		t.Errorf("view=bogus = %d %v, want 400 naming view", code, out)
	}

	_, groups, _ := b.do(t, http.MethodGet, "/api/v1/pairs/groups", "", nil)
	gs := groups["groups"].([]any)
	if len(gs) != 1 || groups["pairs"] != float64(1) {
		t.Fatalf("pair groups = %v, want one group of the one pair", groups)
	}
	g := gs[0].(map[string]any)
	if g["routable"] != float64(1) || g["compatible"] != true || g["prefills"] != float64(1) {
		t.Errorf("group = %v", g)
	}
	pc, dc := g["prefill_class"].(map[string]any)["id"].(string), g["decode_class"].(map[string]any)["id"].(string)
	_, between, _ := b.do(t, http.MethodGet, "/api/v1/pairs?prefill_class="+pc+"&decode_class="+dc, "", nil)
	ps := between["pairs"].([]any)
	if len(ps) != 1 || ps[0].(map[string]any)["breaker"].(map[string]any)["state"] != "half_open" {
		t.Errorf("the group's pairs = %v, want the one pair with its half-open breaker", between)
	}
	if code, out, _ := b.do(t, http.MethodGet, "/api/v1/pairs?prefill_class="+pc, "", nil); code != http.StatusUnprocessableEntity || out["field"] != "decode_class" {
		t.Errorf("prefill_class alone = %d %v, want 422 naming decode_class", code, out)
	}
	for _, q := range []string{"prefill=", "prefill=D0D0D0D0-0000-0000-0000-000000000000"} {
		if code, out, _ := b.do(t, http.MethodGet, "/api/v1/pairs?"+q, "", nil); code != http.StatusBadRequest || out["field"] != "prefill" {
			t.Errorf("%s = %d %v, want 400 naming prefill", q, code, out)
		}
	}
	for _, q := range []string{"prefill_class=&decode_class=" + dc, "prefill_class=XYZ&decode_class=" + dc} {
		if code, out, _ := b.do(t, http.MethodGet, "/api/v1/pairs?"+q, "", nil); code != http.StatusBadRequest || out["field"] != "prefill_class" {
			t.Errorf("%s = %d %v, want 400 naming prefill_class", q, code, out)
		}
	}
	// Each parameter is valid alone by the schema; a combination the
	// handler cannot serve is 422 naming the field, not 400.
	if code, out, _ := b.do(t, http.MethodGet, "/api/v1/pairs?decode_class="+dc+"&prefill=00000000-0000-0000-0000-000000000000", "", nil); code != http.StatusUnprocessableEntity || out["field"] != "prefill" {
		t.Errorf("prefill with decode_class = %d %v, want 422 naming prefill", code, out)
	}
}
