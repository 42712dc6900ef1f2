package router_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

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
	prefills := startPrefills(t, func(c *sim.Config) { c.KVEventsReplayAddr = "127.0.0.1:0" })
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyPrecise, RouteReceipt: true}, prefills[0], prefills[1], d)
	simtest.WaitFor(t, "both prefills' KV events subscribed", func() bool {
		return len(routertest.Samples(t, b.prom, "pdplane_router_kv_events_live", nil)) == 2
	})
	send := func(prompt string) (prefill string, held, of int) {
		t.Helper()
		return sendPrompt(t, b, prompt)
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

// startPrefills starts two SGLang prefill sims, p0 and p1, that publish KV
// events, each with edit's changes to its config.
func startPrefills(t *testing.T, edit func(*sim.Config)) []*sim.Sim {
	t.Helper()
	prefills := make([]*sim.Sim, 2)
	for i := range prefills {
		c := simtest.Config(fmt.Sprintf("p%d", i), registry.RolePrefill, registry.EngineSGLang)
		c.KVEventsAddr = "127.0.0.1:0"
		edit(&c)
		prefills[i] = simtest.Start(t, c)
	}
	return prefills
}

// sendPrompt posts prompt as a completion through b and returns what its
// route receipt says: the prefill, and how many of the prompt's tokens the
// precise policy counted on it holding.
func sendPrompt(t *testing.T, b *bundle, prompt string) (prefill string, held, of int) {
	t.Helper()
	resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":2,"prompt":`+strconv.Quote(prompt)+`}`)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%d %s", resp.StatusCode, body)
		return "", 0, 0
	}
	r := resp.Header.Get(router.RouteReceiptHeader)
	m := regexp.MustCompile(`^prefill=(\S+)@\d+ .* held_tokens=(\d+)/(\d+)`).FindStringSubmatch(r)
	if m == nil {
		t.Errorf("route receipt %q says nothing of the held tokens", r)
		return "", 0, 0
	}
	held, _ = strconv.Atoi(m[2])
	of, _ = strconv.Atoi(m[3])
	return m[1], held, of
}

// TestPreciseQueuesBehindTheSamePrefix: a prompt whose prefix another
// prompt is computing at a prefill goes there, to be computed after it,
// rather than to the other prefill, as busy, that would compute the whole
// of it; the router counts on the blocks the prompt ahead stores before its
// events tell of them, and the prefill's cache serves them.
func TestPreciseQueuesBehindTheSamePrefix(t *testing.T) {
	t.Parallel()
	prefills := startPrefills(t, func(c *sim.Config) { c.PrefillTimePerToken, c.PrefillSlots = 2*time.Millisecond, 1 })
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyPrecise, RouteReceipt: true}, prefills[0], prefills[1], d)
	simtest.WaitFor(t, "both prefills' KV events subscribed", func() bool {
		return len(routertest.Samples(t, b.prom, "pdplane_router_kv_events_live", nil)) == 2
	})
	// The prefills' block size is learnt from their first events.
	warm := map[string]any{"model": "sim-model", "max_tokens": 2, "prompt": strings.Repeat("warm up ", 8)}
	for _, p := range prefills {
		if _, _, err := simtest.NewClient().SGLang(context.Background(), p, d, "/v1/completions", warm, simtest.Room()); err != nil {
			t.Fatal(err)
		}
	}
	simtest.WaitFor(t, "both prefills' blocks indexed", func() bool {
		return len(routertest.Samples(t, b.prom, "pdplane_router_kv_index_blocks", nil)) == 2 &&
			routertest.Value(t, b.prom, "pdplane_router_kv_index_blocks", map[string]string{"peer": "p0"}) > 0 &&
			routertest.Value(t, b.prom, "pdplane_router_kv_index_blocks", map[string]string{"peer": "p1"}) > 0
	})
	cached := func() (n int64) {
		for _, p := range prefills {
			n += p.Stats().CachedPromptTokens
		}
		return n
	}
	before := cached()

	first := strings.Repeat("a long shared prefix the second prompt extends ", 6)
	type sent struct {
		prefill  string
		held, of int
	}
	send := func(prompt string) chan sent {
		done := make(chan sent, 1)
		go func() {
			p, held, of := sendPrompt(t, b, prompt)
			done <- sent{p, held, of}
		}()
		return done
	}
	running := func() int { return prefills[0].Load().Running + prefills[1].Load().Running }
	// The first prompt computes (2 ms a token) at one prefill, then an
	// unrelated one at the other.
	firstDone := send(first)
	simtest.WaitFor(t, "the first prompt at a prefill", func() bool { return running() == 1 })
	otherDone := send(strings.Repeat("an unrelated prompt of about the same length ", 6))
	simtest.WaitFor(t, "the unrelated prompt at the other prefill", func() bool { return running() == 2 })
	p2, held2, of2 := sendPrompt(t, b, first+"and asks one more thing")
	a, other := <-firstDone, <-otherDone
	if other.prefill == a.prefill {
		t.Fatalf("both prompts went to %s, the other prefill idle", a.prefill)
	}
	ps := prefills[0].Config().PageSize
	if p2 != a.prefill || a.held != 0 || held2 == 0 || held2 > a.of/ps*ps {
		t.Fatalf("the first prompt went to %s with %d of %d tokens held, the second to %s with %d of %d held: want the second behind the first, counting on its blocks",
			a.prefill, a.held, a.of, p2, held2, of2)
	}
	// The router leaves out a prompt's block holding its last token, which
	// the engine stores: the cache may serve one block more than counted.
	if hit := int(cached() - before); hit < held2 || hit > held2+ps {
		t.Errorf("the router counted on %d tokens held, the prefill's cache served %d", held2, hit)
	}
}

// TestHostileKVEventsStayWithTheirEngine: a prefill whose KV events
// endpoint sends garbage, over and over, gets its index emptied each time
// (kv_index_resets_total) and counts as holding nothing; the other
// prefill's index, and every request, are untouched by it.
func TestHostileKVEventsStayWithTheirEngine(t *testing.T) {
	t.Parallel()
	c := simtest.Config("good", registry.RolePrefill, registry.EngineSGLang)
	c.KVEventsAddr = "127.0.0.1:0"
	good := simtest.Start(t, c)
	bad := simtest.Start(t, simtest.Config("bad", registry.RolePrefill, registry.EngineSGLang))
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))

	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	t.Cleanup(func() { cancel(); pub.Close() })
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() { // a flood of batches that are not msgpack, in sequence
		for seq := uint64(0); ctx.Err() == nil; seq++ {
			_ = pub.Send(zmq4.NewMsgFrom([]byte("kv"), binary.BigEndian.AppendUint64(nil, seq), []byte("<html>not a batch</html>")))
			time.Sleep(time.Millisecond)
		}
	}()
	var peers []registry.Peer
	for _, s := range []*sim.Sim{good, bad, d} {
		spec, err := s.Spec(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s == bad {
			spec.KVEvents = registry.KVEvents{Endpoint: "tcp://" + pub.Addr().String(), Topic: "kv"}
		}
		peers = append(peers, registry.Peer{PeerSpec: spec})
	}
	b := setup(t, router.Config{PrefillPolicy: router.PolicyPrecise, RouteReceipt: true}, peers...)
	simtest.WaitFor(t, "the bad prefill's index emptied by its garbage", func() bool {
		return routertest.Value(t, b.prom, "pdplane_router_kv_index_resets_total", map[string]string{"peer": "bad"}) >= 2
	})
	prompt := strings.Repeat("a conversation the good prefill holds ", 8)
	// The good prefill computes the prompt (sent to the pair directly), and
	// its events reach the router's index.
	warm := map[string]any{"model": "sim-model", "max_tokens": 2, "prompt": prompt}
	if _, _, err := simtest.NewClient().SGLang(context.Background(), good, d, "/v1/completions", warm, simtest.Room()); err != nil {
		t.Fatal(err)
	}
	simtest.WaitFor(t, "the good prefill's blocks indexed", func() bool {
		return routertest.Value(t, b.prom, "pdplane_router_kv_index_blocks", map[string]string{"peer": "good"}) > 0
	})
	for i := range 6 {
		resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":2,"prompt":`+strconv.Quote(prompt+strconv.Itoa(i))+`}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if r := resp.Header.Get(router.RouteReceiptHeader); !strings.HasPrefix(r, "prefill=good@") {
			t.Errorf("request %d went to %q: the good prefill holds its prefix", i, r)
		}
	}
	if n := routertest.Value(t, b.prom, "pdplane_router_kv_index_resets_total", map[string]string{"peer": "good"}); n != 0 {
		t.Errorf("the good prefill's index was emptied %v times", n)
	}
}

// TestPreciseSpreadsAHotPrefix: a prefix held by one prefill goes there
// while its queue is short, but once the work queued there costs more than
// computing the whole prompt elsewhere, requests sharing it go to the
// other prefill, which then holds it too.
func TestPreciseSpreadsAHotPrefix(t *testing.T) {
	t.Parallel()
	prefills := startPrefills(t, func(c *sim.Config) {
		c.PrefillTimePerToken, c.PrefillSlots, c.Pages = 200*time.Microsecond, 1, 4096
	})
	dc := simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang)
	dc.Pages = 4096 // every prompt's pages at once
	d := simtest.Start(t, dc)
	b := setupSims(t, router.Config{PrefillPolicy: router.PolicyPrecise, RouteReceipt: true}, prefills[0], prefills[1], d)
	hot := strings.Repeat("the hot system prompt everyone shares ", 20)
	warm := map[string]any{"model": "sim-model", "max_tokens": 2, "prompt": hot}
	if _, _, err := simtest.NewClient().SGLang(context.Background(), prefills[0], d, "/v1/completions", warm, simtest.Room()); err != nil {
		t.Fatal(err)
	}
	simtest.WaitFor(t, "p0's blocks indexed", func() bool {
		return routertest.Value(t, b.prom, "pdplane_router_kv_index_blocks", map[string]string{"peer": "p0"}) > 0
	})
	const n = 16
	got := make(chan string, n)
	for i := range n {
		go func() {
			prompt := hot + strings.Repeat(fmt.Sprintf("question %d asks a long thing ", i), 8)
			resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","max_tokens":2,"prompt":`+strconv.Quote(prompt)+`}`)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%d %s", resp.StatusCode, body)
			}
			got <- resp.Header.Get(router.RouteReceiptHeader)
		}()
	}
	to := map[string]int{}
	for range n {
		r := <-got
		to[strings.SplitN(strings.TrimPrefix(r, "prefill="), "@", 2)[0]]++
	}
	if to["p0"] == 0 || to["p1"] == 0 {
		t.Fatalf("%d requests sharing a held prefix went %v: want most to its holder, the rest spread once its queue is long", n, to)
	}
	t.Logf("%d requests sharing p0's prefix: %v", n, to)
}
