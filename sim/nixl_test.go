package sim_test

import (
	"context"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// nixlPair starts a prefill and a decode moving KV through NIXL (UCX over
// loopback TCP); the test is skipped where libnixl_capi.so is absent,
// unless PDPLANE_REQUIRE_NIXL=1.
func nixlPair(t *testing.T, engine registry.Engine) (p, d *sim.Sim) {
	t.Helper()
	pc := simtest.UseNIXL(t, simtest.Config("p0", registry.RolePrefill, engine))
	dc := simtest.UseNIXL(t, simtest.Config("d0", registry.RoleDecode, engine))
	return simtest.Start(t, pc), simtest.Start(t, dc)
}

func TestNIXLSGLang(t *testing.T) {
	p, d := nixlPair(t, registry.EngineSGLang)
	_, dr := pdOK(t, p, d, "/v1/chat/completions", chatBody("move me through NIXL please, across a few pages", 4, false))
	decodeAnswer(t, dr)
	body := chatBody("and stream", 3, true)
	_, dr = pdOK(t, p, d, "/v1/chat/completions", body)
	if evs, done := simtest.Events(dr.Body); len(evs) != 3 || !done {
		t.Fatalf("stream %s", dr.Body)
	}
	missingMemKind(t, p, d, func(ctx context.Context, c *simtest.Client) (simtest.Response, simtest.Response, error) {
		return c.SGLang(ctx, p, d, "/v1/chat/completions", chatBody("transfer me", 3, false), simtest.Room())
	})
	if s := d.Stats(); s.VerifyFailures != 0 || s.Transfers < 5 {
		t.Fatalf("decode stats %+v", s)
	}
}

func TestNIXLVLLM(t *testing.T) {
	p, d := nixlPair(t, registry.EngineVLLM)
	pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "read me through NIXL", "max_tokens": 3})
	missingMemKind(t, p, d, func(ctx context.Context, c *simtest.Client) (simtest.Response, simtest.Response, error) {
		return c.VLLM(ctx, p, d, "/v1/chat/completions", chatBody("read me", 3, false))
	})
}
