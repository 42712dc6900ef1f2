package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/png"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
	"github.com/pdplane/pdplane/web"
)

var update = flag.Bool("update", false, "rewrite testdata/status.png with the browser test's screenshot")

const (
	fixtureReplica = "replica-under-test"
	fixtureVersion = "v9.9.9-test"
	adminToken     = "admin-secret"
	hostile        = `<img src=x onerror=alert(1)>`
	nixlError      = "RuntimeError: Missing NIXL destination KV memory kind"
)

// ---------------------------------------------------------------- server

// fixture is a pdplane server with the status page and a real router
// mounted, on the embedded store, listening on 127.0.0.1, as serve wires
// them.
type fixture struct {
	t      *testing.T
	url    string
	store  *memstore.Store
	reg    *prometheus.Registry
	router *router.Router
	// series are the router's collectors by the names of their series, so
	// that a test takes the names the router registers and copies none.
	series *recordingRegisterer
	gate   *streamGate
	// back sets the store's clock back by this many nanoseconds, so that a
	// test can build a fleet with a history spread over the past.
	back atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	// Nothing here runs the lease sweeper: a peer whose heartbeats stop
	// shows its lease as expired but keeps its state.
	f := &fixture{t: t}
	store := memstore.New(memstore.Config{Now: func() time.Time { return time.Now().Add(-time.Duration(f.back.Load())) }})
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	series := &recordingRegisterer{Registerer: reg, byName: map[string]prometheus.Collector{}}
	// One failure opens a breaker, and it stays open for the test: an
	// engine that refuses a connection shows in the breaker column at once.
	rt, err := router.New(router.Config{Replica: fixtureReplica, BreakerFailures: 1, BreakerCooldown: time.Hour, MaxAttempts: 1},
		mirror, store, log, series)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{AdminToken: adminToken, Replica: fixtureReplica, StoreKind: "memory", Version: fixtureVersion},
		server.Deps{Store: store, Snaps: mirror, Registry: reg, Routes: rt, Breakers: rt, Web: web.Handler()}, log)
	if err != nil {
		t.Fatal(err)
	}
	gate := &streamGate{next: srv.Handler(), open: map[int]context.CancelFunc{}}
	ts := httptest.NewServer(gate)
	t.Cleanup(ts.Close)
	t.Cleanup(gate.closeAll) // before ts.Close, which waits for open streams
	f.url, f.store, f.reg, f.gate, f.router, f.series = ts.URL, store, reg, gate, rt, series
	return f
}

// streamGate passes everything to the server, but can cut the event stream:
// it ends the open streams and answers new ones 503 until it is reopened,
// as a restarting server or a broken proxy would.
type streamGate struct {
	next http.Handler
	mu   sync.Mutex
	cut  bool
	seq  int
	open map[int]context.CancelFunc
}

func (g *streamGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/events/stream" {
		g.next.ServeHTTP(w, r)
		return
	}
	g.mu.Lock()
	if g.cut {
		g.mu.Unlock()
		http.Error(w, "event stream cut by the test", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	g.seq++
	id := g.seq
	g.open[id] = cancel
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.open, id)
		g.mu.Unlock()
		cancel()
	}()
	g.next.ServeHTTP(w, r.WithContext(ctx))
}

// setCut cuts the stream (true) or lets it through again (false).
func (g *streamGate) setCut(cut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cut = cut
	if cut {
		for _, cancel := range g.open {
			cancel()
		}
	}
}

func (g *streamGate) closeAll() { g.setCut(true) }

// call sends a JSON request to the API and decodes the answer into out
// (when not nil), failing the test unless the status is want.
func (f *fixture) call(method, path, token string, body any, want int, out any) {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			f.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		f.t.Fatalf("%s %s = %d, want %d: %s", method, path, res.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("%s %s: decode %s: %v", method, path, data, err)
		}
	}
}

// register registers spec through the API and returns the peer's id.
func (f *fixture) register(spec registry.PeerSpec) string {
	f.t.Helper()
	var p struct {
		ID string `json:"id"`
	}
	f.call(http.MethodPost, "/api/v1/peers", adminToken, apiconv.Registration(&spec), http.StatusCreated, &p)
	return p.ID
}

func (f *fixture) reregister(spec registry.PeerSpec) {
	f.t.Helper()
	f.call(http.MethodPost, "/api/v1/peers", adminToken, apiconv.Registration(&spec), http.StatusOK, nil)
}

func (f *fixture) heartbeat(id, instance string, load registry.Load) {
	f.t.Helper()
	l := apiconv.Load(load)
	f.call(http.MethodPost, "/api/v1/peers/"+id+"/heartbeat", adminToken,
		api.Heartbeat{InstanceId: instance, Load: &l}, http.StatusOK, nil)
}

func (f *fixture) markStale(id, reason, errText string) {
	f.t.Helper()
	f.call(http.MethodPost, "/api/v1/peers/"+id+"/stale", adminToken,
		map[string]string{"reason": reason, "error": errText}, http.StatusOK, nil)
}

// --------------------------------------------------------------- browser

// chromiumPath finds the browser: $PDPLANE_CHROMIUM, else chromium on PATH.
// Without one the test is skipped, unless PDPLANE_REQUIRE_CHROMIUM=1 (as in
// CI), where a missing browser is a failure.
func chromiumPath(t *testing.T) string {
	t.Helper()
	var tried []string
	if p := os.Getenv("PDPLANE_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		tried = append(tried, p+" (from $PDPLANE_CHROMIUM)")
	} else {
		if p, err := exec.LookPath("chromium"); err == nil {
			return p
		}
		tried = append(tried, "chromium on $PATH")
	}
	msg := fmt.Sprintf("no Chromium found (tried %s); install Debian's chromium or set PDPLANE_CHROMIUM", strings.Join(tried, ", "))
	if os.Getenv("PDPLANE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg + "; set PDPLANE_REQUIRE_CHROMIUM=1 to make this a failure")
	return ""
}

// cspProbe runs before the page's own scripts (injected through DevTools, so
// the page's policy does not apply to it) and records every violation of the
// policy the page reports.
const cspProbe = `window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__csp.push(e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') + ' ' + (e.sample || ''));
});`

// browser is one headless Chromium tab at 1280×800 that records what the
// page writes to the console and every JavaScript dialog it opens.
type browser struct {
	ctx context.Context

	mu      sync.Mutex
	console []chromedp.ConsoleMessage
	dialogs []string
	flushes int         // markers written by flushConsole so far
	marks   chan string // flushConsole's markers, as they come back
}

// flushMarker prefixes the console lines flushConsole writes.
const flushMarker = "pdplane-test-flush-"

func newBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("lang", "en-US"),
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{ctx: ctx, marks: make(chan string, 16)}

	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if strings.HasPrefix(m.Text, flushMarker) {
				b.marks <- m.Text
				continue
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.dialogs = append(b.dialogs, string(ev.Type)+": "+ev.Message)
			b.mu.Unlock()
			// An open dialog blocks the page; dismiss it so that the test
			// fails on the record instead of hanging.
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspProbe}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *browser) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %v\n%s", err, b.pageText())
	}
}

// eval evaluates a JavaScript expression and decodes its value into T.
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript predicate until it holds.
func (b *browser) waitFor(t *testing.T, what, predicate string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](predicate,
		chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		t.Fatalf("waiting for %s: %v\n%s", what, err, b.pageText())
	}
}

// pageText is what the page shows, for failure messages.
func (b *browser) pageText() string {
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ''`))
	if err != nil {
		return "(page text unavailable: " + err.Error() + ")"
	}
	return "page shows:\n" + text
}

// problems returns the console errors and exceptions and the dialogs so far.
func (b *browser) problems(t *testing.T) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.console {
		switch m.Type {
		case chromedp.ConsoleError, chromedp.ConsoleException:
			out = append(out, fmt.Sprintf("console %s (%s): %s", m.Type, m.URL, m.Text))
		case chromedp.ConsoleWarning:
			t.Logf("console warning: %s", m.Text)
		}
	}
	for _, d := range b.dialogs {
		out = append(out, "dialog opened: "+d)
	}
	return out
}

// checkClean fails the test on any console error, exception, dialog or CSP
// violation so far.
func (b *browser) checkClean(t *testing.T, when string) {
	t.Helper()
	b.flushConsole(t)
	for _, p := range b.problems(t) {
		t.Errorf("%s: %s", when, p)
	}
	for _, v := range eval[[]string](t, b, `window.__csp || ['the CSP probe did not run']`) {
		t.Errorf("%s: CSP violation: %s", when, v)
	}
}

// flushConsole writes a marker to the page's console and waits for it to
// come back: the browser sends console events in order, so every message
// the page wrote before it has been recorded by then.
func (b *browser) flushConsole(t *testing.T) {
	t.Helper()
	b.flushes++
	marker := fmt.Sprintf("%s%d", flushMarker, b.flushes)
	eval[bool](t, b, "console.debug("+jsString(marker)+"), true")
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-b.marks:
			if got == marker {
				return
			}
		case <-deadline:
			t.Fatalf("the console marker %s never came back", marker)
		}
	}
}

func jsString(s string) string {
	data, _ := json.Marshal(s)
	return string(data)
}

// stateOf is a predicate on the state word shown in a peer's row.
func stateOf(id, state string) string {
	return fmt.Sprintf(`(document.querySelector('#peer-groups tr[data-peer-id=%s] .state-word') || {}).textContent === %s`,
		jsString(id), jsString(state))
}

// ------------------------------------------------------------------ tests

// TestStatusPageLive drives the page in Chromium while the fleet changes
// underneath it through the API: it must follow without a reload, render
// hostile data as text, and say when it has lost the event stream.
func TestStatusPageLive(t *testing.T) {
	// Not parallel: each browser test starts a Chromium of its own.
	chromium := chromiumPath(t)
	f := newFixture(t)
	p0 := f.register(registrytest.Spec("p0", registry.RolePrefill))
	d0 := f.register(registrytest.Spec("d0", registry.RoleDecode))
	f.heartbeat(p0, "inst-p0", registry.Load{Running: 2, Queued: 1, KVUsage: 0.25})
	f.heartbeat(d0, "inst-d0", registry.Load{Running: 7, KVUsage: 0.5})

	b := newBrowser(t, chromium)
	b.do(t, chromedp.Navigate(f.url+"/"))
	b.waitFor(t, "the registered peers", stateOf(p0, "ready")+" && "+stateOf(d0, "ready"), 10*time.Second)
	b.waitFor(t, "the live badge", `document.getElementById('conn-text').textContent === 'live'`, 10*time.Second)
	b.waitFor(t, "a routable pair", `!!document.querySelector('#pair-matrix td.v-routable button')`, 10*time.Second)
	if got := eval[string](t, b, `document.querySelector('[data-chart=rps]').textContent`); !strings.Contains(got, "no traffic yet") {
		t.Errorf("with no router metrics the requests chart shows %q, want 'no traffic yet'", got)
	}
	// A marker that a reload would wipe.
	b.do(t, chromedp.Evaluate[chromedp.Void](`window.__noReload = true`))

	t.Run("metrics maths", func(t *testing.T) {
		for _, tc := range []struct{ expr, want string }{
			// histogram_quantile: linear inside the bucket holding the rank.
			{`+P.quantile(0.5, [{le: 0.1, count: 0}, {le: 0.2, count: 10}, {le: Infinity, count: 10}]).toFixed(6)`, `0.15`},
			{`P.quantile(0.99, [{le: 0.1, count: 5}, {le: 0.2, count: 10}, {le: Infinity, count: 20}])`, `0.2`},
			{`P.quantile(0.5, [{le: 0.1, count: 0}, {le: Infinity, count: 0}])`, `null`}, // NaN: no requests
			// A counter that went down was reset: count from zero.
			{`P.counterDelta(100, 7)`, `7`},
			{`P.rates({requests: 10, errors: 1, retries: 0, ttft: []}, {requests: 40, errors: 4, retries: 2, ttft: []}, 0, 2000).rps`, `15`},
			{`P.parse('a_total{route="/v1/x",msg="say \\"hi\\", {ok}"} 3\n# HELP b x\nb 1e3\nc{le="+Inf"} 7 1700000000\n')`,
				`[{"name":"a_total","labels":{"route":"/v1/x","msg":"say \"hi\", {ok}"},"value":3},{"name":"b","labels":{},"value":1000},{"name":"c","labels":{"le":"+Inf"},"value":7}]`},
			{`(({present, traffic, requests, errors}) => [present, traffic, requests, errors])(P.routerTotals(P.parse(` +
				`'pdplane_router_requests_total{route="r",outcome="ok"} 90\npdplane_router_requests_total{route="r",outcome="upstream_error"} 4\n' + ` +
				`'pdplane_router_requests_total{route="r",outcome="bad_request"} 6\n')))`, `[true,true,100,4]`},
		} {
			got := eval[string](t, b, `(() => { const P = window.pdplaneProm; return JSON.stringify(`+tc.expr+`); })()`)
			if got != tc.want {
				t.Errorf("%s = %s, want %s", tc.expr, got, tc.want)
			}
		}
	})

	t.Run("new peer appears live", func(t *testing.T) {
		d1 := f.register(registrytest.Spec("d1", registry.RoleDecode))
		b.waitFor(t, "d1 pending", stateOf(d1, "pending"), 5*time.Second)
		f.heartbeat(d1, "inst-d1", registry.Load{})
		b.waitFor(t, "d1 ready", stateOf(d1, "ready"), 5*time.Second)

		// Its agent reports the engine down: the badge turns red and says
		// why; healthy again, it is ready again.
		f.call(http.MethodPost, "/api/v1/peers/"+d1+"/heartbeat", adminToken,
			map[string]any{"instance_id": "inst-d1", "engine_healthy": false, "engine_error": "GET /health: connection refused"}, http.StatusOK, nil)
		b.waitFor(t, "d1 unhealthy", stateOf(d1, "unhealthy"), 5*time.Second)
		badge := `document.querySelector('#peer-groups tr[data-peer-id=` + jsString(d1) + `] .state')`
		if got := eval[string](t, b, `getComputedStyle(`+badge+`).color`); got != "rgb(179, 18, 31)" {
			t.Errorf("unhealthy badge colour %s, want red rgb(179, 18, 31)", got)
		}
		if got := eval[string](t, b, badge+`.title`); got != "engine unhealthy: GET /health: connection refused" {
			t.Errorf("unhealthy badge title %q, want the probe error", got)
		}
		f.heartbeat(d1, "inst-d1", registry.Load{})
		b.waitFor(t, "d1 ready again", stateOf(d1, "ready"), 5*time.Second)
	})

	t.Run("stale mark shows live", func(t *testing.T) {
		f.markStale(d0, "transfer worker on p0: KV transfer failed", nixlError)
		b.waitFor(t, "d0 stale", stateOf(d0, "stale"), 5*time.Second)
		b.waitFor(t, "the stale event with its error text",
			`[...document.querySelectorAll('#event-list .ev-stale pre.err')].some((e) => e.textContent === `+jsString(nixlError)+`)`, 5*time.Second)
		b.waitFor(t, "the heal plan's start in the timeline", `!!document.querySelector('#event-list .ev-heal_started')`, 5*time.Second)
		if !eval[bool](t, b, `window.__noReload === true`) {
			t.Error("the page reloaded to show the stale mark")
		}
	})

	t.Run("hostile name is text", func(t *testing.T) {
		spec := registrytest.Spec(hostile, registry.RoleDecode)
		spec.Labels = map[string]string{"note": `<script>window.__pwned = true</script>`}
		spec.KVEvents = registry.KVEvents{Endpoint: "tcp://10.0.0.9:5557", Topic: `<b>kv</b>`}
		id := f.register(spec)
		f.markStale(id, `<b onmouseover=alert(2)>reason</b>`, `<svg onload=alert(3)>`)
		b.waitFor(t, "the hostile peer's row", stateOf(id, "stale"), 5*time.Second)
		name := jsString(hostile)
		b.waitFor(t, "the hostile name in the table and the timeline",
			`[...document.querySelectorAll('#peer-groups .peer-link')].some((e) => e.textContent === `+name+`) && `+
				`[...document.querySelectorAll('#event-list .peer-link')].some((e) => e.textContent === `+name+`)`, 5*time.Second)
		b.clickWhenThere(t, "the peer's name", `#peer-groups tr[data-peer-id=`+jsString(id)+`] .peer-link`, 10*time.Second)
		// Its facts come from the peer list at once, its ranks with the
		// peer's own record a moment later.
		b.waitFor(t, "the detail view with its ranks", `document.getElementById('peer-dialog').open && !!document.querySelector('#pd-body .facts') && `+
			`!!document.querySelector('#pd-body .rank-sum')`, 5*time.Second)
		if got := eval[string](t, b, `document.getElementById('pd-title').firstChild.textContent`); got != hostile {
			t.Errorf("detail title = %q, want %q", got, hostile)
		}
		// The detail view draws ranks from the open summary: sizes and kinds,
		// no KV pointers.
		if got := eval[string](t, b, `document.querySelector('#pd-body .rank-sum').textContent`); !strings.Contains(got, "2 KV regions, 2 MiB") || !strings.Contains(got, "agent metadata") {
			t.Errorf("rank summary = %q", got)
		}
		if eval[bool](t, b, `document.getElementById('pd-body').textContent.includes('0x7f')`) {
			t.Error("the detail view shows a KV pointer")
		}
		if got := eval[bool](t, b, `[...document.querySelectorAll('#pd-body .label')].some((e) => e.textContent === 'note=<script>window.__pwned = true</script>')`); !got {
			t.Error("the hostile label is not shown as text")
		}
		// Where its engine publishes its KV events, the topic as text.
		if got := eval[string](t, b, `[...document.querySelectorAll('#pd-body .facts dt')].find((e) => e.textContent === 'KV events').nextElementSibling.textContent`); !strings.Contains(got, "tcp://10.0.0.9:5557 topic <b>kv</b>") {
			t.Errorf("KV events fact = %q", got)
		}
		injected := eval[[]string](t, b, `[...document.querySelectorAll('img, script, svg[onload], b')]`+
			`.filter((e) => e.tagName === 'B' || e.hasAttribute('onerror') || e.hasAttribute('onload') || e.getAttribute('src') === 'x' || (e.tagName === 'SCRIPT' && !e.src))`+
			`.map((e) => e.outerHTML)`)
		if len(injected) > 0 {
			t.Errorf("elements were created from data: %q", injected)
		}
		if eval[bool](t, b, `window.__pwned === true`) {
			t.Error("a script from a label ran")
		}
		b.do(t, chromedp.Click(chromedp.CSS(`#peer-dialog .close`)))
		b.waitFor(t, "the detail view to close", `!document.getElementById('peer-dialog').open`, 5*time.Second)
	})

	// Everything so far is what an operator does all day: it must not have
	// caused a single console error, exception, dialog or CSP violation.
	b.checkClean(t, "page in normal use")

	t.Run("admin actions show problem details", func(t *testing.T) {
		d1 := "" // find d1 by name
		var peers struct {
			Peers []struct{ ID, Name string } `json:"peers"`
		}
		f.call(http.MethodGet, "/api/v1/peers", "", nil, http.StatusOK, &peers)
		for _, p := range peers.Peers {
			if p.Name == "d1" {
				d1 = p.ID
			}
		}
		open := func() {
			b.clickWhenThere(t, "decode d1's name", `#peer-groups tr[data-peer-id=`+jsString(d1)+`] .peer-link`, 10*time.Second)
			b.waitFor(t, "d1's detail view", `document.getElementById('peer-dialog').open && !!document.querySelector('#pd-body .facts')`, 5*time.Second)
		}
		open()
		if eval[bool](t, b, `!!document.querySelector('#pd-body [data-action=drain]')`) {
			t.Error("actions are offered before an admin token is set")
		}
		b.do(t, chromedp.Click(chromedp.CSS(`#peer-dialog .close`)))

		b.do(t, chromedp.SendKeys(chromedp.ID("token"), "wrong-token"), chromedp.Click(chromedp.CSS(`#token-form button[type=submit]`)))
		if got := eval[string](t, b, `sessionStorage.getItem('pdplane.adminToken')`); got != "wrong-token" {
			t.Errorf("token in sessionStorage = %q", got)
		}
		open()
		b.clickWhenThere(t, "the drain button", `#pd-body [data-action=drain]`, 10*time.Second)
		b.waitFor(t, "the 401 problem detail", `(document.querySelector('#pd-body .notice.problem') || {}).textContent?.includes('the bearer token is not accepted')`, 5*time.Second)
		b.do(t, chromedp.Click(chromedp.CSS(`#peer-dialog .close`)))

		b.do(t, chromedp.Click(chromedp.ID("token-clear")))
		b.do(t, chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.CSS(`#token-form button[type=submit]`)))
		open()
		b.clickWhenThere(t, "the drain button", `#pd-body [data-action=drain]`, 10*time.Second)
		b.waitFor(t, "d1 draining", stateOf(d1, "draining"), 5*time.Second)
		b.waitFor(t, "the success notice", `!!document.querySelector('#pd-body .notice.ok')`, 5*time.Second)

		// Half-way through typing a stale mark, the peer changes under the
		// operator's hands: the live re-render must keep the form.
		b.clickWhenThere(t, "the mark-stale button", `#pd-body [data-action=stale]`, 10*time.Second)
		b.do(t, chromedp.SendKeys(chromedp.CSS(`#pd-body input[name=error]`), "typed by the operator"))
		f.heartbeat(d1, "inst-d1", registry.Load{Running: 1})
		f.call(http.MethodPost, "/api/v1/peers/"+d1+"/drain", adminToken, nil, http.StatusOK, nil)
		b.waitFor(t, "the history to show the second drain", `document.querySelectorAll('#pd-body table.history .kind-drained').length === 2`, 5*time.Second)
		if got := eval[string](t, b, `(document.querySelector('#pd-body [data-action-form=stale]:not([hidden]) input[name=error]') || {}).value`); got != "typed by the operator" {
			t.Fatalf("after a live update the stale form holds %q", got)
		}
		b.clickWhenThere(t, "the mark-stale form's submit", `#pd-body [data-action-form=stale] button[type=submit]`, 10*time.Second)
		b.waitFor(t, "d1 stale", stateOf(d1, "stale"), 5*time.Second)
		b.waitFor(t, "the operator's error text in the timeline",
			`[...document.querySelectorAll('#event-list .ev-stale pre.err')].some((e) => e.textContent === 'typed by the operator')`, 5*time.Second)
		b.do(t, chromedp.Click(chromedp.CSS(`#peer-dialog .close`)))
	})

	t.Run("disconnect is visible and recovers", func(t *testing.T) {
		f.gate.setCut(true)
		b.waitFor(t, "the disconnected badge and banner",
			`document.getElementById('conn-text').textContent === 'disconnected' && !document.getElementById('banner').hidden`, 10*time.Second)
		f.gate.setCut(false)
		b.waitFor(t, "the stream to come back", `document.getElementById('conn-text').textContent === 'live' && document.getElementById('banner').hidden`, 20*time.Second)
		// Changes made after the reconnect arrive live again.
		d2 := f.register(registrytest.Spec("d2", registry.RoleDecode))
		b.waitFor(t, "a peer registered after the reconnect", stateOf(d2, "pending"), 5*time.Second)
		b.waitFor(t, "its registration in the timeline",
			`[...document.querySelectorAll('#event-list .ev-registered .peer-link')].some((e) => e.textContent === 'd2')`, 5*time.Second)
	})

	// The failed admin call and the cut stream log network errors by
	// design; exceptions and policy violations are never expected.
	b.flushConsole(t)
	for _, p := range b.problems(t) {
		if strings.Contains(p, "exception") || strings.Contains(p, "dialog") {
			t.Error(p)
		}
	}
	for _, v := range eval[[]string](t, b, `window.__csp`) {
		t.Errorf("CSP violation: %s", v)
	}
}

// TestStatusPageScreenshot renders a realistic fleet (stale decode, a
// re-registration, a quarantined pair, a refused pair, router traffic) and
// saves the screenshot the README shows. It is rewritten only with -update.
func TestStatusPageScreenshot(t *testing.T) {
	chromium := chromiumPath(t)
	f := newFixture(t)
	stopTraffic := fakeRouterTraffic(t, f.series)
	defer stopTraffic()
	ids := buildFleet(f)

	b := newBrowser(t, chromium)
	// Scrape /metrics every second so the charts fill within the test.
	b.do(t, chromedp.Navigate(f.url+"/?interval=1"))
	b.waitFor(t, "the fleet", stateOf(ids["decode-1"], "stale")+" && "+stateOf(ids["prefill-2"], "draining"), 10*time.Second)
	b.waitFor(t, "the quarantined pair", `!!document.querySelector('#pair-matrix td.v-quarantined button')`, 10*time.Second)
	// What the picture is for: each of these must be on the page.
	b.waitFor(t, "decode-2 re-registered (generation 2)",
		fmt.Sprintf(`(document.querySelector('#peer-groups tr[data-peer-id=%s] .gen') || {}).textContent === '2'`, jsString(ids["decode-2"])), 10*time.Second)
	b.waitFor(t, "decode-3 refused by the three prefills", `document.querySelectorAll('#pair-matrix td.v-refused button').length === 3`, 10*time.Second)
	b.waitFor(t, "every chart drawn", `document.querySelectorAll('#charts svg path.line').length >= 5`, 20*time.Second)
	// Enough points for the lines to have a shape: one a scrape, so the
	// page scrapes about 15 s.
	const points = 15
	b.waitFor(t, fmt.Sprintf("%d points on the request chart", points),
		fmt.Sprintf(`((document.querySelector('#charts [data-chart=rps] path.line') || {getAttribute: () => ''}).getAttribute('d').match(/[ML]/g) || []).length >= %d`, points), 40*time.Second)
	if rps := eval[string](t, b, `document.querySelector('#charts [data-chart=rps] .fig').textContent`); rps == "" || rps == "–" || rps == "—" || rps == "0" {
		t.Errorf("the request chart shows %q, want the router's traffic", rps)
	}
	b.clickWhenThere(t, "the quarantined pair", `#pair-matrix td.v-quarantined button`, 10*time.Second)
	b.waitFor(t, "the pinned pair's reason", `document.getElementById('pair-detail').textContent.includes('quarantined')`, 5*time.Second)
	b.do(t, chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)`))
	b.checkClean(t, "screenshot fleet")

	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if size := img.Bounds().Size(); size.X != 1280 || size.Y != 800 {
		t.Errorf("screenshot is %d×%d, want 1280×800", size.X, size.Y)
	}
	// A rendered page has text, state colours and chart lines; a blank or
	// half-painted one has a handful of colours.
	colours := map[[4]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 2 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 2 {
			r, g, b, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, b, a}] = true
		}
	}
	if len(colours) < 500 {
		t.Errorf("the screenshot has %d colours: the page was not rendered", len(colours))
	}
	path := filepath.Join(t.TempDir(), "status.png")
	if *update {
		path = filepath.Join("testdata", "status.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot written to %s (%d colours)", path, len(colours))
}

// buildFleet registers a fleet the way a morning on call finds it and
// returns the peers' ids by name.
func buildFleet(f *fixture) map[string]string {
	const model = "deepseek-ai/DeepSeek-V3"
	spec := func(name string, role registry.Role, host string, gpu0 int) registry.PeerSpec {
		s := registrytest.Spec(name, role)
		s.Model = model
		s.URL = "http://" + host + ":30000"
		s.InstanceID = fmt.Sprintf("%s-%08x", name, rand.Uint32())
		s.Labels = map[string]string{"zone": "us-east-1a", "host": host}
		s.Parallelism = registry.Parallelism{TPSize: 2}
		s.KV = registry.KVGeometry{PageSize: 64, DType: "bfloat16", NumLayers: 61, NumKVHeads: 1, HeadDim: 576, IsMLA: true}
		s.Ranks = nil
		for r := range 2 {
			rank := registry.Rank{Rank: r, GPUID: gpu0 + r, AgentName: fmt.Sprintf("%s-r%d-%04x", name, r, rand.Uint32()>>16),
				AgentMetadata: bytes.Repeat([]byte{0xA5}, 2048)}
			for l := range 61 {
				rank.KVDataPtrs = append(rank.KVDataPtrs, 0x7f3a00000000+uint64(r)<<36+uint64(l)<<28)
				rank.KVDataLens = append(rank.KVDataLens, 72<<20)
				rank.KVItemLens = append(rank.KVItemLens, 64*576*2)
				rank.KVMemKinds = append(rank.KVMemKinds, registry.VRAM)
			}
			s.Ranks = append(s.Ranks, rank)
		}
		return s.WithDefaults()
	}
	specs := []registry.PeerSpec{
		spec("prefill-0", registry.RolePrefill, "10.0.1.11", 0),
		spec("prefill-1", registry.RolePrefill, "10.0.1.12", 0),
		spec("prefill-2", registry.RolePrefill, "10.0.1.13", 0),
		spec("decode-0", registry.RoleDecode, "10.0.2.21", 0),
		spec("decode-1", registry.RoleDecode, "10.0.2.22", 0),
		spec("decode-2", registry.RoleDecode, "10.0.2.23", 0),
		spec("decode-3", registry.RoleDecode, "10.0.2.24", 2),
	}
	specs[6].KV.PageSize = 32 // a misconfigured decode: refused by every prefill
	ids := map[string]string{}
	load := map[string]registry.Load{
		"prefill-0": {Running: 6, Queued: 1, KVUsage: 0.41}, "prefill-1": {Running: 5, Queued: 0, KVUsage: 0.37},
		"prefill-2": {Running: 1, KVUsage: 0.08}, "decode-0": {Running: 48, Queued: 3, KVUsage: 0.72},
		"decode-1": {Running: 0, KVUsage: 0.05}, "decode-2": {Running: 41, Queued: 0, KVUsage: 0.66},
		"decode-3": {Running: 0, KVUsage: 0},
	}
	instances := map[string]string{}
	at := func(ago time.Duration) { f.back.Store(int64(ago)) }
	at(47 * time.Minute)
	for _, s := range specs {
		ids[s.Name] = f.register(s)
		instances[s.Name] = s.InstanceID
	}
	for _, s := range specs {
		f.heartbeat(ids[s.Name], s.InstanceID, load[s.Name])
	}
	// decode-2 failed a transfer, re-registered under fresh NIXL agent
	// names (generation 2), then failed again with prefill-1: quarantined.
	at(21*time.Minute + 12*time.Second)
	failed := func(agent string) map[string]string { // prefill-1's report of a failed transfer
		return map[string]string{"reason": "prefill-1 answered HTTP 500", "error": nixlError,
			"prefill_id": ids["prefill-1"], "agent_name": agent}
	}
	f.call(http.MethodPost, "/api/v1/peers/"+ids["decode-2"]+"/stale", adminToken, failed(specs[5].Ranks[0].AgentName), http.StatusOK, nil)
	at(21*time.Minute + 10*time.Second)
	f.heartbeat(ids["decode-2"], instances["decode-2"], load["decode-2"])
	re := specs[5]
	for i := range re.Ranks {
		re.Ranks[i].AgentName += "-g2"
	}
	at(21*time.Minute + 9*time.Second)
	f.reregister(re)
	f.heartbeat(ids["decode-2"], instances["decode-2"], load["decode-2"])
	at(21*time.Minute + 7*time.Second)
	// The same pair fails again: the registry quarantines it.
	f.call(http.MethodPost, "/api/v1/peers/"+ids["decode-2"]+"/stale", adminToken, failed(re.Ranks[0].AgentName), http.StatusOK, nil)
	at(9*time.Minute + 31*time.Second)
	f.call(http.MethodPost, "/api/v1/peers/"+ids["prefill-2"]+"/drain", adminToken, nil, http.StatusOK, nil)
	// And now: decode-1 just went stale.
	at(40 * time.Second)
	f.markStale(ids["decode-1"], "transfer worker on prefill-0: KV write failed", nixlError)
	at(0)
	for _, s := range specs {
		f.heartbeat(ids[s.Name], s.InstanceID, load[s.Name])
	}

	// Keep heartbeating so leases and "last heartbeat" look alive.
	f.t.Cleanup(everyTick(2*time.Second, func(ctx context.Context) {
		for _, s := range specs {
			l := load[s.Name]
			if l.Running > 2 {
				l.Running += rand.IntN(5) - 2
				l.KVUsage = math.Min(0.95, math.Max(0, l.KVUsage+(rand.Float64()-0.5)*0.04))
			}
			wl := apiconv.Load(l)
			body, _ := json.Marshal(api.Heartbeat{InstanceId: instances[s.Name], Load: &wl})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/api/v1/peers/"+ids[s.Name]+"/heartbeat", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+adminToken)
			req.Header.Set("Content-Type", "application/json")
			if res, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}
	}))
	return ids
}

// fakeRouterTraffic feeds a plausible load into the fixture's router's own
// series (names, labels, buckets: not a copy of them) until stopped, so the
// page's charts have something to draw. If the router renames a series the
// page reads, this fails naming it.
func fakeRouterTraffic(t *testing.T, rr *recordingRegisterer) (stop func()) {
	t.Helper()
	requests := routerSeries[*prometheus.CounterVec](t, rr, "pdplane_router_requests_total")
	ttft := routerSeries[*prometheus.HistogramVec](t, rr, "pdplane_router_ttft_seconds")
	retries := routerSeries[*prometheus.CounterVec](t, rr, "pdplane_router_retries_total")
	inflight := routerSeries[prometheus.Gauge](t, rr, "pdplane_router_inflight_requests")

	start := time.Now()
	return everyTick(100*time.Millisecond, func(context.Context) {
		s := time.Since(start).Seconds()
		perSecond := 38 + 14*math.Sin(s/3) + 4*rand.NormFloat64()
		n := int(math.Max(0, perSecond/10+rand.Float64()))
		inflight.Set(float64(40 + rand.IntN(20)))
		for range n {
			route := "/v1/chat/completions"
			if rand.IntN(5) == 0 {
				route = "/generate"
			}
			switch x := rand.Float64(); {
			case x < 0.015:
				requests.WithLabelValues(route, "upstream_error").Inc()
				continue
			case x < 0.05:
				retries.WithLabelValues("missing_memkind").Inc()
			}
			requests.WithLabelValues(route, "ok").Inc()
			// Log-normal around 140 ms, slower while the load peaks.
			ttft.WithLabelValues(route, "sim-model").Observe(0.14 * (1 + 0.3*math.Sin(s/3)) * math.Exp(0.45*rand.NormFloat64()))
		}
	})
}

// everyTick calls fn on a goroutine of its own every interval until the
// returned stop is called; stop waits for the goroutine to end. fn's
// context ends with stop.
func everyTick(interval time.Duration, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			fn(ctx)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// recordingRegisterer registers collectors on the wrapped registerer and
// remembers each by the names of the series it describes.
type recordingRegisterer struct {
	prometheus.Registerer
	byName map[string]prometheus.Collector
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	for d := range descs {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			r.byName[m[1]] = c
		}
	}
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// routerSeries returns the collector the router registered for name.
func routerSeries[C prometheus.Collector](t *testing.T, r *recordingRegisterer, name string) C {
	t.Helper()
	c, ok := r.byName[name].(C)
	if !ok {
		names := make([]string, 0, len(r.byName))
		for n := range r.byName {
			names = append(names, n)
		}
		t.Fatalf("the router registers no %s of type %v (the page reads it); it registers %v", name, reflect.TypeFor[C](), names)
	}
	return c
}

// readyPair registers prefill p0 and decode d0 and heartbeats both: one
// routable pair. It returns their ids and the decode's spec, which a test
// re-registers to stand for a restarted engine.
func (f *fixture) readyPair() (p0, d0 string, dspec registry.PeerSpec) {
	f.t.Helper()
	pspec := registrytest.Spec("p0", registry.RolePrefill)
	dspec = registrytest.Spec("d0", registry.RoleDecode)
	p0, d0 = f.register(pspec), f.register(dspec)
	f.heartbeat(p0, pspec.InstanceID, registry.Load{})
	f.heartbeat(d0, dspec.InstanceID, registry.Load{})
	return p0, d0, dspec
}

// clickWhenThere clicks the element selector names, from inside the page,
// once it is there: live re-renders replace the page's elements (often at 10,000 peers), and one
// may replace the element between a DevTools query and its click.
func (b *browser) clickWhenThere(t *testing.T, what, selector string, timeout time.Duration) {
	t.Helper()
	b.waitFor(t, what, `(() => { const e = document.querySelector(`+jsString(selector)+`); if (!e) return false; e.click(); return true; })()`, timeout)
}
