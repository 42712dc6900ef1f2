package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/sim/simtest"
)

// quarantine drives the pair into quarantine the way the product does: a
// failed transfer, a re-registration under a fresh agent, the same failure.
func quarantine(t *testing.T, b *bundle, prefillID string, dspec *registry.PeerSpec, decodeID string) {
	t.Helper()
	ctx := context.Background()
	report := func() registry.TransferOutcome {
		_, out, err := b.store.ReportTransferFailure(ctx, registry.TransferFailure{DecodeID: decodeID,
			DecodeAgent: dspec.Ranks[0].AgentName, PrefillID: prefillID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	report()
	dspec.Ranks[0].AgentName += "-g2"
	if _, err := b.store.Register(ctx, *dspec, registry.Claim{Admin: true}); err != nil {
		t.Fatal(err)
	}
	if out := report(); out != registry.OutcomeQuarantined {
		t.Fatalf("repeat: %s", out)
	}
}

func TestLiftQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pf, dspec := registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode)
	pid := b.register(t, pf)["id"].(string)
	did := b.register(t, dspec)["id"].(string)
	b.heartbeat(t, pid, pf.InstanceID)
	b.heartbeat(t, did, dspec.InstanceID)
	routable := func() bool {
		r := b.mirror.Snapshot().Routes("m")
		return r != nil && len(r.DecodesFor(pid)) == 1
	}
	simtest.WaitFor(t, "a routable pair", routable)
	quarantine(t, b, pid, &dspec, did)
	simtest.WaitFor(t, "the quarantine in the snapshot", func() bool { return !routable() })

	code, out, _ := b.do(t, "GET", "/api/v1/pairs", "", nil)
	pair := out["pairs"].([]any)[0].(map[string]any)
	q, _ := pair["quarantine"].(map[string]any)
	if code != 200 || pair["quarantined"] != true || pair["routable"] != false || q == nil || q["trial"] != false ||
		!strings.Contains(q["detail"].(string), "Missing NIXL") {
		t.Fatalf("quarantined pair: %d %v", code, pair)
	}

	path := "/api/v1/pairs/" + pid + "/" + did + "/quarantine"
	if code, out, _ := b.do(t, "DELETE", path, "", nil); code != http.StatusUnauthorized {
		t.Fatalf("lift without a token: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "DELETE", path, b.cred(pid), nil); code != http.StatusForbidden {
		t.Fatalf("lift with a peer's credential: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "DELETE", path, adminToken, nil); code != http.StatusNoContent {
		t.Fatalf("lift: %d %v", code, out)
	}
	simtest.WaitFor(t, "the pair routable again", routable)
	code, out, _ = b.do(t, "GET", "/api/v1/pairs", "", nil)
	pair = out["pairs"].([]any)[0].(map[string]any)
	if code != 200 || pair["routable"] != true || pair["quarantine"] != nil || pair["quarantined"] != nil {
		t.Fatalf("lifted pair: %d %v", code, pair)
	}
	code, out, _ = b.do(t, "GET", "/api/v1/events?peer_id="+did+"&limit=1", "", nil)
	ev := out["events"].([]any)[0].(map[string]any)
	if code != 200 || ev["kind"] != "quarantine_lifted" || !strings.Contains(ev["message"].(string), "admin") {
		t.Fatalf("lift event: %d %v", code, ev)
	}

	for _, p := range []string{
		path, // no longer quarantined
		"/api/v1/pairs/6f1c3c55-1111-4222-8333-444455556666/" + did + "/quarantine",
		"/api/v1/pairs/" + pid + "/not-a-peer/quarantine",
	} {
		code, out, h := b.do(t, "DELETE", p, adminToken, nil)
		if code != http.StatusNotFound || h.Get("Content-Type") != "application/problem+json" || out["detail"] == "" {
			t.Errorf("DELETE %s: %d %s %v; want a 404 problem", p, code, h.Get("Content-Type"), out)
		}
	}
}
