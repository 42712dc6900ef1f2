package router_test

import (
	"net/http"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
)

const retries = "pdplane_router_retries_total"

// TestRetriesCountOnlyRetries: a request served by its first pair counts no
// retry; a failure with no other pair to try is answered, not retried, and
// counts none either (it used to count one); a failure that moves the
// request to another pair counts exactly one.
func TestRetriesCountOnlyRetries(t *testing.T) {
	t.Parallel()
	const chat = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`

	t.Run("served first time", func(t *testing.T) {
		t.Parallel()
		s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{"p1": registry.RolePrefill, "d1": registry.RoleDecode})
		b := setupSims(t, router.Config{}, s["p1"], s["d1"])
		if resp, body := b.post(t, "/v1/chat/completions", chat); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if got := b.total(t, retries, nil); got != 0 {
			t.Fatalf("retries_total = %v after a request served first time", got)
		}
	})

	t.Run("no other pair", func(t *testing.T) {
		t.Parallel()
		s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{"p1": registry.RolePrefill, "d1": registry.RoleDecode})
		setFault(t, s["p1"], sim.FaultPrefillError)
		b := setupSims(t, router.Config{}, s["p1"], s["d1"])
		if resp, body := b.post(t, "/v1/chat/completions", chat); resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("%d %s, want 502", resp.StatusCode, body)
		}
		if n := s["p1"].Stats().Requests; n != 1 {
			t.Fatalf("the prefill saw %d requests, want 1", n)
		}
		if got := b.total(t, retries, nil); got != 0 {
			t.Fatalf("retries_total = %v for a request never retried", got)
		}
	})

	t.Run("retried once", func(t *testing.T) {
		t.Parallel()
		s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{
			"p1": registry.RolePrefill, "p2": registry.RolePrefill, "d1": registry.RoleDecode,
		})
		setFault(t, s["p1"], sim.FaultPrefillError)
		b := setupSims(t, router.Config{PrefillPolicy: router.PolicyRoundRobin}, s["p1"], s["p2"], s["d1"])
		// Round robin reaches p1 within two requests; each request adds
		// one retry exactly when it went to p1 first.
		hit := false
		for i := range 4 {
			before, p1 := b.total(t, retries, nil), s["p1"].Stats().Requests
			if resp, body := b.post(t, "/v1/chat/completions", chat); resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			want := float64(s["p1"].Stats().Requests - p1)
			if got := b.total(t, retries, nil) - before; got != want {
				t.Fatalf("request %d: retries_total rose by %v, want %v", i, got, want)
			}
			hit = hit || want == 1
		}
		if !hit {
			t.Fatal("no request went to the failing prefill")
		}
		if got := b.metric(t, retries, map[string]string{"reason": "status"}); got < 1 {
			t.Fatalf("retries_total{reason=status} = %v", got)
		}
	})
}
