package sim_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestPairFault: the missing-mem-kind fault limited to one prefill's pair
// (bootstrap_port) breaks only that prefill's transfers to the decode; the
// other prefill keeps sending, and the decode counts what it received by
// prefill. A target on another fault is refused, naming the field.
func TestPairFault(t *testing.T) {
	t.Parallel()
	p0, d := simtest.Pair(t, registry.EngineSGLang, nil)
	p1 := simtest.Start(t, simtest.Config("p1", registry.RolePrefill, registry.EngineSGLang))
	c := simtest.NewClient()
	ctx := context.Background()

	r, err := c.Post(ctx, d.URL(), "/_sim/fault", map[string]any{"fault": "slow", "bootstrap_port": p0.BootstrapPort()}, nil)
	if err != nil || r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), `"field":"bootstrap_port"`) {
		t.Fatalf("a target on the slow fault: %v %d %s", err, r.Status, r.Body)
	}
	r, err = c.Post(ctx, d.URL(), "/_sim/fault", map[string]any{"fault": "missing-mem-kind", "bootstrap_port": p0.BootstrapPort()}, nil)
	if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"bootstrap_port":`+strconv.Itoa(p0.BootstrapPort())) {
		t.Fatalf("set the pair fault: %v %d %s", err, r.Status, r.Body)
	}
	send := func(src *sim.Sim) (int, string) {
		t.Helper()
		pr, _, err := c.SGLang(ctx, src, d, "/v1/chat/completions", chatBody("hi", 2, false), simtest.Room())
		if err != nil {
			t.Fatal(err)
		}
		return pr.Status, string(pr.Body)
	}
	if st, body := send(p0); st != http.StatusInternalServerError || !strings.Contains(body, "Missing NIXL destination KV memory kind") {
		t.Fatalf("through the broken pair: %d %s", st, body)
	}
	for range 2 {
		if st, body := send(p1); st != http.StatusOK {
			t.Fatalf("through the healthy pair: %d %s", st, body)
		}
	}
	from := d.Stats().TransfersFrom
	var fromP0, fromP1 int64
	for addr, n := range from {
		switch {
		case strings.HasSuffix(addr, ":"+strconv.Itoa(p0.BootstrapPort())):
			fromP0 += n
		case strings.HasSuffix(addr, ":"+strconv.Itoa(p1.BootstrapPort())):
			fromP1 += n
		}
	}
	if fromP0 != 0 || fromP1 != 2 {
		t.Fatalf("transfers received by prefill: %v; want none from p0, 2 from p1", from)
	}
}
