package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// red is the colour of the unhealthy and failed badges (style.css --failed
// and --unhealthy).
const red = "rgb(179, 18, 31)"

// TestStatusPageCrashedEngineAndBreaker: a decode whose engine crashes under
// a real agent turns red on the page with the probe's error, and a peer
// whose engine refuses the router's connection shows its open breaker (the
// router's own observation) in the breaker column and the fleet summary.
// The header names the replica, store and version that answer.
func TestStatusPageCrashedEngineAndBreaker(t *testing.T) {
	chromium := chromiumPath(t)
	f := newFixture(t)

	// A decode whose engine answers /health, watched by a real agent.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(engine.Close)
	spec := registrytest.Spec("decode-crash", registry.RoleDecode)
	spec.URL = engine.URL
	runAgent(t, f, spec)

	// A pair whose engines refuse every connection.
	ps, ds := registrytest.Spec("prefill-dead", registry.RolePrefill), registrytest.Spec("decode-dead", registry.RoleDecode)
	ps.Model, ds.Model = "dead-model", "dead-model"
	ps.URL, ds.URL = closedURL(t), closedURL(t)
	pDead, dDead := f.register(ps), f.register(ds)
	f.heartbeat(pDead, ps.InstanceID, registry.Load{})
	f.heartbeat(dDead, ds.InstanceID, registry.Load{})

	b := newBrowser(t, chromium)
	b.do(t, chromedp.Navigate(f.url+"/"))
	crash := f.peerID("decode-crash")
	b.waitFor(t, "the agent's decode ready", stateOf(crash, "ready"), 15*time.Second)
	b.waitFor(t, "the header naming replica, store and version",
		`document.getElementById('origin-replica').textContent === `+jsString(fixtureReplica)+` && `+
			`document.getElementById('origin-store').textContent === 'memory' && `+
			`document.getElementById('origin-version').textContent === `+jsString(fixtureVersion), 5*time.Second)

	t.Run("crashed engine is red with the probe's error", func(t *testing.T) {
		engine.Close() // the engine process is gone: connections are refused
		b.waitFor(t, "decode-crash unhealthy", stateOf(crash, "unhealthy"), 15*time.Second)
		row := `document.querySelector('#peer-groups tr[data-peer-id=` + jsString(crash) + `]')`
		if got := eval[string](t, b, `getComputedStyle(`+row+`.querySelector('.state')).color`); got != red {
			t.Errorf("the crashed engine's badge is %s, want red %s", got, red)
		}
		reason := eval[string](t, b, row+`.querySelector('.reason').textContent`)
		if !strings.Contains(reason, "/health") || !strings.Contains(reason, "connection refused") {
			t.Errorf("the crashed engine's row says %q, want the probe's error (/health: … connection refused)", reason)
		}
		b.waitFor(t, "the unhealthy count in the fleet summary",
			`(document.querySelector('#summary [data-count=state-unhealthy] strong') || {}).textContent === '1'`, 10*time.Second)
	})

	t.Run("open breaker is shown", func(t *testing.T) {
		if got := eval[string](t, b, `document.querySelector('#peer-groups tr[data-peer-id=`+jsString(pDead)+`] .brk').textContent`); got != "closed" {
			t.Fatalf("before any request prefill-dead's breaker shows %q, want closed", got)
		}
		res, err := http.Post(f.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"dead-model","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode < 500 {
			t.Fatalf("a completion over engines that refuse connections = %d, want a 5xx: %s", res.StatusCode, body)
		}
		// Which leg failed first is the router's business; the API says
		// which peer's breaker it opened, and the page must show the same.
		open := ""
		for _, p := range f.peerSummaries() {
			if p.Breaker != nil && p.Breaker.State == "open" {
				open = p.ID
			}
		}
		if open != pDead && open != dDead {
			t.Fatalf("no open breaker on prefill-dead or decode-dead after a refused connection (open: %q)", open)
		}
		b.waitFor(t, "the open breaker in the breaker column",
			`(document.querySelector('#peer-groups tr[data-peer-id=`+jsString(open)+`] .brk-open') || {}).textContent === 'open'`, 15*time.Second)
		b.waitFor(t, "open breakers in the fleet summary", `!!document.querySelector('#summary [data-count=breakers]')`, 10*time.Second)
	})
	b.checkClean(t, "crashed engine and open breaker")
}

// fixedEngine is an agent.Engine that always describes the same spec: the
// agent's side of an engine whose health the test controls over HTTP.
type fixedEngine struct{ spec registry.PeerSpec }

func (e fixedEngine) Spec(context.Context) (registry.PeerSpec, error) { return e.spec, nil }
func (fixedEngine) Reregister(context.Context, string) error          { return nil }

// runAgent runs a real agent for spec against the fixture until the test
// ends; one failed probe makes the engine unhealthy.
func runAgent(t *testing.T, f *fixture, spec registry.PeerSpec) {
	t.Helper()
	ag, err := agent.New(agent.Config{ControlPlane: f.url, JoinToken: adminToken,
		Probe: agent.ProbeConfig{FailureThreshold: 1, Timeout: time.Second}}, fixedEngine{spec}, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ag.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// closedURL is the URL of a port nothing listens on: connections to it are
// refused, as to an engine that crashed.
func closedURL(t *testing.T) string {
	t.Helper()
	return "http://" + bench.FreeAddr(t)
}

// peerSummary is what the tests read of GET /api/v1/peers?view=summary.
type peerSummary struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	State   string `json:"state"`
	Ranks   []any  `json:"ranks"`
	Breaker *struct {
		State string `json:"state"`
	} `json:"breaker"`
}

// peerSummaries lists the peers as the page reads them, without ranks.
func (f *fixture) peerSummaries() []peerSummary {
	f.t.Helper()
	var list struct {
		Peers []peerSummary `json:"peers"`
	}
	f.call(http.MethodGet, "/api/v1/peers?view=summary", "", nil, http.StatusOK, &list)
	return list.Peers
}

// peerID finds a peer's id by its name, waiting for its agent to register
// it.
func (f *fixture) peerID(name string) string {
	f.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, p := range f.peerSummaries() {
			if p.Name == name {
				return p.ID
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("no peer named %s registered", name)
		}
		time.Sleep(50 * time.Millisecond) // polling for a registration the agent makes on its own schedule
	}
}

// getJSON decodes a GET answer into out and returns its size in bytes.
func (f *fixture) getJSON(path string, out any) int {
	f.t.Helper()
	res, err := http.Get(f.url + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, res.Body); err != nil {
		f.t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		f.t.Fatalf("GET %s = %d: %.200s", path, res.StatusCode, buf.String())
	}
	if err := json.Unmarshal(buf.Bytes(), out); err != nil {
		f.t.Fatalf("GET %s: %v", path, err)
	}
	return buf.Len()
}
