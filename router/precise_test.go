package router_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/router/routertest"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestPreciseRoutesToTheHolder: under the precise policy a prompt goes to
// the prefill whose KV events say it holds the prompt's first blocks. Each
// of eight conversations sends a first turn, then a second that extends it;
// the first 512 bytes of the two differ (the prompts are short), so the
// cache_aware ring, which hashes those, would send about half the second
// turns to the other prefill. The precise policy sends every one to the
// prefill that computed the first, and says in the receipt how many of its
// tokens that prefill held; the prefill's own cache agrees.
func TestPreciseRoutesToTheHolder(t *testing.T) {
	t.Parallel()
	prefills := make([]*sim.Sim, 2)
	for i := range prefills {
		c := simtest.Config(fmt.Sprintf("p%d", i), registry.RolePrefill, registry.EngineSGLang)
		c.KVEventsAddr, c.KVEventsReplayAddr = "127.0.0.1:0", "127.0.0.1:0"
		prefills[i] = simtest.Start(t, c)
	}
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyPrecise, RouteReceipt: true}, prefills[0], prefills[1], d)
	simtest.WaitFor(t, "both prefills' KV events subscribed", func() bool {
		return len(routertest.Samples(t, b.prom, "pdplane_router_kv_events_live", nil)) == 2
	})
	send := func(prompt string) (prefill string, held, of int) {
		t.Helper()
		resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":2,"prompt":`+strconv.Quote(prompt)+`}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		r := resp.Header.Get(router.RouteReceiptHeader)
		m := regexp.MustCompile(`^prefill=(\S+)@\d+ .* held_tokens=(\d+)/(\d+)`).FindStringSubmatch(r)
		if m == nil {
			t.Fatalf("route receipt %q says nothing of the held tokens", r)
		}
		held, _ = strconv.Atoi(m[2])
		of, _ = strconv.Atoi(m[3])
		return m[1], held, of
	}
	batches := func() (n float64) {
		for _, v := range routertest.Samples(t, b.prom, "pdplane_router_kv_events_batches_total", nil) {
			n += v
		}
		return n
	}
	ps := prefills[0].Config().PageSize
	for i := range 8 {
		first := fmt.Sprintf("%d conversation: %s", i, strings.Repeat("the user asks about caches ", 6))
		applied := batches()
		p1, held1, of1 := send(first)
		// The prefill's events (a batch per prefill) reach the router's index.
		simtest.WaitFor(t, "the first turn's blocks indexed", func() bool { return batches() > applied })
		p2, held2, of2 := send(first + " and then asks again")
		if p2 != p1 {
			t.Errorf("conversation %d: the first turn went to %s, the second to %s", i, p1, p2)
		}
		if held1 != 0 || held2 != of1/ps*ps || of2 <= of1 {
			t.Errorf("conversation %d: held %d of %d, then %d of %d; want 0, then the first turn's %d full blocks of %d",
				i, held1, of1, held2, of2, of1/ps, ps)
		}
	}
	// What the router predicted is what the prefills' caches served.
	var hit float64
	for _, p := range prefills {
		hit += float64(p.Stats().CachedPromptTokens)
	}
	if predicted := routertest.Value(t, b.prom, "pdplane_router_precise_cached_tokens_total", nil); predicted != hit || hit == 0 {
		t.Errorf("the router predicted %v cached prompt tokens, the prefills' caches served %v", predicted, hit)
	}
}
