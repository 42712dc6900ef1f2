package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
)

// setupOver is setup over store (the embedded store or PostgreSQL), with a
// chance to change the server's config.
func setupOver(t *testing.T, store registry.Store, change func(*server.Config)) *bundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{AdminToken: adminToken, JoinTokens: []string{joinToken}, MaxBodyBytes: 8 << 20}
	if change != nil {
		change(&cfg)
	}
	deps := server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}
	srv, err := server.New(cfg, deps, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &bundle{url: ts.URL, store: store, mirror: mirror, reg: deps.Registry, srv: srv, creds: map[string]string{}, ids: map[string]string{}}
}

// ready registers spec with the join token and heartbeats it to ready.
func (b *bundle) ready(t *testing.T, spec registry.PeerSpec) string {
	t.Helper()
	id := b.register(t, spec)["id"].(string)
	if hb := b.heartbeat(t, id, spec.InstanceID); hb["state"] != "ready" {
		t.Fatalf("peer %s after its heartbeat: %v", spec.Name, hb)
	}
	return id
}

// wantState fails unless peer id is in state.
func (b *bundle) wantState(t *testing.T, id, state string) {
	t.Helper()
	code, out, _ := b.do(t, "GET", "/api/v1/peers/"+id, "", nil)
	if code != 200 || out["state"] != state {
		t.Fatalf("peer %s: %d %v, want state %s", id, code, out, state)
	}
}

// TestReportsOnlyFromAPartyToThePair re-runs issue 31's first finding: a
// decode's credential reports a victim decode it can never pair with,
// naming the victim's public agent and the memory-kind reason. Each such
// report is refused with 403 and the victim stays ready, in both stores;
// the prefill of a pair the registry routes is still heard.
func TestReportsOnlyFromAPartyToThePair(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, store registry.Store) {
		b := setupOver(t, store, nil)
		victim := b.ready(t, registrytest.Spec("d0", registry.RoleDecode))
		attacker := b.ready(t, registrytest.Spec("d1", registry.RoleDecode))
		other := registrytest.Spec("p9", registry.RolePrefill)
		other.Model = "another-model"
		otherModel := b.ready(t, other)
		prefill := b.ready(t, registrytest.Spec("p0", registry.RolePrefill))

		reason := "KV transfer failed: destination memory kind missing"
		for name, c := range map[string]struct {
			cred   string
			report map[string]any
		}{
			"a decode, without prefill_id":          {b.cred(attacker), map[string]any{"reason": reason, "agent_name": "d0-agent-0"}},
			"a decode, as its own prefill_id":       {b.cred(attacker), map[string]any{"reason": reason, "agent_name": "d0-agent-0", "prefill_id": attacker}},
			"a decode, naming the real prefill":     {b.cred(attacker), map[string]any{"reason": reason, "agent_name": "d0-agent-0", "prefill_id": prefill}},
			"a prefill of another model":            {b.cred(otherModel), map[string]any{"reason": reason, "agent_name": "d0-agent-0", "prefill_id": otherModel}},
			"a prefill, without its own prefill_id": {b.cred(prefill), map[string]any{"reason": reason, "agent_name": "d0-agent-0"}},
		} {
			for i := 0; i < 4; i++ { // four reports exhausted --heal-max-per-hour
				code, out, _ := b.do(t, "POST", "/api/v1/peers/"+victim+"/stale", c.cred, c.report)
				if code != http.StatusForbidden || out["type"] != server.ProblemForbidden {
					t.Fatalf("%s reports d0: %d %v, want 403", name, code, out)
				}
			}
			b.wantState(t, victim, "ready")
		}
		evs, err := b.store.Events(context.Background(), registry.EventQuery{PeerID: victim, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == registry.EventStale || strings.Contains(e.Message, "heal") {
				t.Fatalf("a refused report left an event on the victim: %+v", e)
			}
		}
		code, out, _ := b.do(t, "POST", "/api/v1/peers/"+victim+"/stale", b.cred(prefill),
			map[string]any{"reason": reason, "agent_name": "d0-agent-0", "prefill_id": prefill})
		if code != 200 {
			t.Fatalf("the prefill of the pair reports d0: %d %v", code, out)
		}
	})
}

// TestReportsArePerVictimLimited pins that the reports about one decode are
// bounded from all reporters together, and that only reports that pass the
// authority check spend the victim's limit.
func TestReportsArePerVictimLimited(t *testing.T) {
	t.Parallel()
	b := setupOver(t, memstore.New(memstore.Config{}), func(c *server.Config) { c.StaleVictimBurst, c.StaleVictimRate = 2, 0.001 })
	victim := b.ready(t, registrytest.Spec("d0", registry.RoleDecode))
	attacker := b.ready(t, registrytest.Spec("d1", registry.RoleDecode))
	p0 := b.ready(t, registrytest.Spec("p0", registry.RolePrefill))
	p1 := b.ready(t, registrytest.Spec("p1", registry.RolePrefill))
	for i := 0; i < 5; i++ {
		if code, out, _ := b.do(t, "POST", "/api/v1/peers/"+victim+"/stale", b.cred(attacker),
			map[string]any{"reason": "x", "agent_name": "d0-agent-0", "prefill_id": attacker}); code != 403 {
			t.Fatalf("the attacker's report: %d %v", code, out)
		}
	}
	report := func(p string) (int, map[string]any, http.Header) {
		return b.do(t, "POST", "/api/v1/peers/"+victim+"/stale", b.cred(p),
			map[string]any{"reason": "KV transfer failed", "agent_name": "d0-agent-0", "prefill_id": p})
	}
	for _, p := range []string{p0, p1} {
		if code, out, _ := report(p); code != 200 {
			t.Fatalf("a prefill's report within the victim's burst: %d %v", code, out)
		}
	}
	code, out, hdr := report(p1)
	if code != 429 || out["type"] != server.ProblemRateLimited || hdr.Get("Retry-After") == "" ||
		!strings.Contains(out["detail"].(string), "from all reporters") {
		t.Fatalf("a report past the victim's burst: %d %v", code, out)
	}
}

// TestReregistrationKeepsRoleAndModel re-runs issue 31's second finding: a
// decode re-registers itself as role both (or for another model) with its
// own credential, to read another decode's transfer secret. The
// re-registration is refused with 403 naming the field, the decode stays
// what it was, and the read stays refused; the admin token may change it.
func TestReregistrationKeepsRoleAndModel(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, store registry.Store) {
		b := setupOver(t, store, nil)
		d0 := registrytest.Spec("d0", registry.RoleDecode)
		attacker := b.ready(t, d0)
		victim := b.ready(t, registrytest.Spec("d1", registry.RoleDecode))
		both := d0
		both.Role = registry.RoleBoth
		otherModel := d0
		otherModel.Model = "another-model"
		for field, spec := range map[string]registry.PeerSpec{"role": both, "model": otherModel} {
			code, out, _ := b.do(t, "POST", "/api/v1/peers", b.cred(attacker), spec)
			if code != http.StatusForbidden || out["field"] != field || !strings.Contains(out["detail"].(string), "admin token") {
				t.Fatalf("d0 re-registers with another %s: %d %v", field, code, out)
			}
			if code, out, _ := b.do(t, "GET", "/api/v1/peers/"+victim+"/registration", b.cred(attacker), nil); code != http.StatusForbidden {
				t.Fatalf("d0 reads d1's registration after its refused re-registration: %d %v", code, out)
			}
		}
		code, out, _ := b.do(t, "GET", "/api/v1/peers/"+attacker, "", nil)
		if code != 200 || out["role"] != "decode" || out["model"] != d0.Model || out["generation"] != float64(1) {
			t.Fatalf("d0 after the refused re-registrations: %d %v", code, out)
		}
		if code, out, _ := b.do(t, "POST", "/api/v1/peers", adminToken, both); code != 200 || out["role"] != "both" {
			t.Fatalf("the admin re-registers d0 as both: %d %v", code, out)
		}
	})
}

// TestAgentNamesCannotBeSquatted re-runs issue 31's third finding: a new
// decode registers another live decode's public NIXL agent name. It is
// refused with 409 naming the holder and the rank's field, nothing is
// stored, and the holder stays ready; once the holder's lease is gone the
// name is free again.
func TestAgentNamesCannotBeSquatted(t *testing.T) {
	t.Parallel()
	bothStores(t, func(t *testing.T, store registry.Store) {
		b := setupOver(t, store, nil)
		holder := b.ready(t, registrytest.Spec("d0", registry.RoleDecode))
		squat := registrytest.Spec("d9", registry.RoleDecode)
		squat.Ranks = slices.Clone(squat.Ranks)
		squat.Ranks[0].AgentName = "d0-agent-0"
		for _, token := range []string{joinToken, adminToken} {
			code, out, _ := b.do(t, "POST", "/api/v1/peers", token, squat)
			if code != http.StatusConflict || out["type"] != server.ProblemConflict || out["field"] != "ranks[0].agent_name" ||
				!strings.Contains(out["detail"].(string), "live peer d0") {
				t.Fatalf("d9 registers d0's agent name: %d %v", code, out)
			}
		}
		if code, out, _ := b.do(t, "GET", "/api/v1/peers", "", nil); code != 200 || len(out["peers"].([]any)) != 1 {
			t.Fatalf("the refused squatter was stored: %d %v", code, out)
		}
		b.wantState(t, holder, "ready")
		if _, err := store.ExpireLeases(context.Background(), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if code, out, _ := b.do(t, "POST", "/api/v1/peers", joinToken, squat); code != http.StatusCreated {
			t.Fatalf("d9 takes the agent name after d0's lease ran out: %d %v", code, out)
		}
	})
}
