package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestProbeAndPreflight walks the API the agents use for preflights: the
// decode publishes its probe (its own credential only), its prefill reads
// it (secret included) while a peer of the same role may not, the prefill
// reports a failed preflight (the decode may not report it for the
// prefill), and the pair turns unroutable with the backend's error as its
// reason while another prefill keeps the decode; a passed preflight puts
// the pair back with its GB/s.
func TestProbeAndPreflight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p0, p1, d0 := registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("p1", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode)
	pid := b.register(t, p0)["id"].(string)
	p1id := b.register(t, p1)["id"].(string)
	did := b.register(t, d0)["id"].(string)
	for id, inst := range map[string]string{pid: p0.InstanceID, p1id: p1.InstanceID, did: d0.InstanceID} {
		b.heartbeat(t, id, inst)
	}
	probe := map[string]any{"agent_name": "d0-probe", "backend": "tcp", "mem_kind": "DRAM", "metadata": "bWQ=",
		"addr": uint64(1)<<63 + 4096, "len": 2 << 20, "transfer_secret": "MDEyMzQ1Njc4OWFiY2RlZg=="}
	probePath := "/api/v1/peers/" + did + "/probe"
	if code, out, _ := b.do(t, "PUT", probePath, b.cred(pid), probe); code != http.StatusForbidden {
		t.Fatalf("publish another peer's probe: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "PUT", probePath, b.cred(did), probe); code != 200 || out["generation"] != float64(1) {
		t.Fatalf("publish probe: %d %v", code, out)
	}
	bad := map[string]any{"agent_name": "d0-probe", "backend": "tcp", "mem_kind": "DRAM", "metadata": "bWQ=", "addr": 0, "len": 0}
	if code, out, _ := b.do(t, "PUT", probePath, b.cred(did), bad); code/100 != 4 || !strings.Contains(out["field"].(string), "len") {
		t.Fatalf("publish an empty region: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "GET", probePath, b.cred(pid), nil); code != 200 || out["agent_name"] != "d0-probe" ||
		out["transfer_secret"] != probe["transfer_secret"] || out["addr"] != float64(probe["addr"].(uint64)) {
		t.Fatalf("prefill reads the probe: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "GET", probePath, "", nil); code != http.StatusUnauthorized {
		t.Fatalf("anonymous probe read: %d %v", code, out)
	}

	routes := func(prefill string) int {
		r := b.mirror.Snapshot().Routes("m")
		if r == nil {
			return 0
		}
		return len(r.DecodesFor(prefill))
	}
	simtest.WaitFor(t, "both prefills routed to the decode", func() bool { return routes(pid) == 1 && routes(p1id) == 1 })
	const nixlErr = "preflight write of 4096 bytes: nixl_capi_check_remote_md: not found (-6)"
	failed := map[string]any{"state": "failed", "backend": "nixl", "mem_kind": "DRAM", "gbps": 0, "latency_us": 0,
		"checked_at": "2026-12-01T10:00:00Z", "error": nixlErr}
	reportPath := "/api/v1/pairs/" + pid + "/" + did + "/preflight"
	if code, out, _ := b.do(t, "PUT", reportPath, b.cred(did), failed); code != http.StatusForbidden {
		t.Fatalf("the decode reports for the prefill: %d %v", code, out)
	}
	failed["state"] = "maybe"
	if code, out, _ := b.do(t, "PUT", reportPath, b.cred(pid), failed); code/100 != 4 || out["field"] == nil {
		t.Fatalf("unknown state: %d %v", code, out)
	}
	failed["state"] = "failed"
	if code, out, _ := b.do(t, "PUT", reportPath, b.cred(pid), failed); code != 200 || out["current"] != true {
		t.Fatalf("report failed preflight: %d %v", code, out)
	}
	simtest.WaitFor(t, "the failed preflight in the snapshot", func() bool { return routes(pid) == 0 })
	if routes(p1id) != 1 {
		t.Fatalf("the other prefill lost the decode")
	}
	pair := b.pair(t, pid, did)
	pre, _ := pair["preflight"].(map[string]any)
	if pair["routable"] != false || !strings.Contains(pair["reason"].(string), nixlErr) || pre == nil || pre["state"] != "failed" {
		t.Fatalf("pair after a failed preflight: %v", pair)
	}

	if code, out, _ := b.do(t, "GET", "/api/v1/pairs?prefill="+p1id, "", nil); code != 200 || out["total"] != float64(1) ||
		out["pairs"].([]any)[0].(map[string]any)["prefill"].(map[string]any)["id"] != p1id {
		t.Fatalf("pairs of one prefill: %d %v", code, out)
	}
	passed := map[string]any{"state": "passed", "backend": "nixl", "mem_kind": "DRAM", "gbps": 1.25, "latency_us": 80.5,
		"checked_at": "2026-12-01T10:01:00Z"}
	if code, out, _ := b.do(t, "PUT", reportPath, b.cred(pid), passed); code != 200 {
		t.Fatalf("report passed preflight: %d %v", code, out)
	}
	simtest.WaitFor(t, "the pair routable again", func() bool { return routes(pid) == 1 })
	pair = b.pair(t, pid, did)
	pre, _ = pair["preflight"].(map[string]any)
	if pair["routable"] != true || pre == nil || pre["gbps"] != 1.25 || pre["latency_us"] != 80.5 {
		t.Fatalf("pair after a passed preflight: %v", pair)
	}
}

// pair returns the pair (prefill, decode) from GET /api/v1/pairs.
func (b *bundle) pair(t *testing.T, prefill, decode string) map[string]any {
	t.Helper()
	code, out, _ := b.do(t, "GET", "/api/v1/pairs", "", nil)
	if code != 200 {
		t.Fatalf("list pairs: %d %v", code, out)
	}
	for _, x := range out["pairs"].([]any) {
		p := x.(map[string]any)
		if p["prefill"].(map[string]any)["id"] == prefill && p["decode"].(map[string]any)["id"] == decode {
			return p
		}
	}
	t.Fatalf("no pair %s -> %s in %v", prefill, decode, out)
	return nil
}
