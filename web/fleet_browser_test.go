package web_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// Bounds of the 10,000-peer test. They are functional deadlines (the page
// must get there at all, without a reload), not performance targets: on the
// 2-core machine the page loaded in about LOAD s and showed one peer's
// change in about UPDATE s; each bound is about five times that.
const (
	fleetLoadBound   = 30 * time.Second
	fleetUpdateBound = 10 * time.Second
)

// TestStatusPageFleetOf10000 registers 10,000 peers through the API (two
// models, two geometry classes each) and drives the page: it loads, counts
// the fleet from the summary read, groups the 25 million pairs by class
// instead of drawing them, drills into one group's matrix, and shows one
// peer's change without reloading the list. It logs the load time and the
// size of GET /api/v1/peers?view=summary.
func TestStatusPageFleetOf10000(t *testing.T) {
	chromium := chromiumPath(t)
	f := newFixture(t, mirrorDebounce(250*time.Millisecond))
	const n = 10000
	specs := make([]registry.PeerSpec, n)
	for i := range specs {
		role := registry.RolePrefill
		if i%2 == 1 {
			role = registry.RoleDecode
		}
		s := registrytest.Spec(fmt.Sprintf("peer-%05d", i), role)
		s.Model = []string{"org/model-a", "org/model-b"}[i/2%2]
		if i%10 >= 8 {
			s.KV.PageSize = 32 // a second geometry class per model and role
		}
		specs[i] = s
	}
	start := time.Now()
	ids := f.registerAll(specs)
	t.Logf("registered and heartbeated %d peers through the API in %s", n, time.Since(start).Round(time.Millisecond))

	summaryBytes := f.bodySize("/api/v1/peers?view=summary")
	fullBytes := f.bodySize("/api/v1/peers")
	t.Logf("GET /api/v1/peers?view=summary at %d peers: %d bytes (%.1f MiB); with rank regions (view=full): %d bytes",
		n, summaryBytes, float64(summaryBytes)/(1<<20), fullBytes)
	if summaryBytes >= fullBytes {
		t.Errorf("the summary view (%d bytes) is not smaller than the full one (%d bytes)", summaryBytes, fullBytes)
	}
	for _, p := range f.peerSummaries()[:3] {
		if p.Ranks != nil {
			t.Fatalf("view=summary lists %s's ranks", p.Name)
		}
	}

	b := newBrowser(t, chromium)
	start = time.Now()
	b.do(t, chromedp.Navigate(f.url+"/"))
	b.waitFor(t, "the fleet of 10,000 loaded", `(document.querySelector('#summary [data-count=peers] strong') || {}).textContent === '10,000' && `+
		`(document.querySelector('#summary [data-count=state-ready] strong') || {}).textContent === '10,000' && `+
		`document.querySelectorAll('#peer-groups tr[data-peer-id]').length > 0 && `+
		`document.querySelectorAll('#pair-groups tr[data-group-row]').length === 8 && `+
		`document.getElementById('conn-text').textContent === 'live'`, fleetLoadBound)
	load := time.Since(start)
	t.Logf("page load at %d peers: %s (navigation to summary, peer table, pair groups and live stream shown)", n, load.Round(time.Millisecond))
	b.do(t, chromedp.Evaluate[chromedp.Void](`window.__noReload = true`))

	// 5,000 × 5,000 pairs: the counts come from the groups, no matrix is
	// drawn until a group is chosen.
	want := 2500*2500*2 - 0 // same-model pairs; cross-model pairs are refused and in no group
	if got := eval[string](t, b, `document.querySelector('#summary [data-count=pairs] strong').textContent`); got != fmt.Sprintf("%s", commas(routablePairs())) {
		t.Errorf("routable pairs in the summary = %s, want %s (of %d same-model pairs)", got, commas(routablePairs()), want)
	}
	if eval[bool](t, b, `!!document.querySelector('#pair-matrix table.matrix')`) {
		t.Error("a matrix is drawn for 25 million pairs")
	}

	t.Run("drill into a group", func(t *testing.T) {
		b.do(t, chromedp.Click(chromedp.CSS(`#pair-groups [data-group]`)))
		b.waitFor(t, "the group's 40×40 matrix", `document.querySelectorAll('#pair-matrix table.matrix tbody tr').length === 40 && `+
			`document.querySelectorAll('#pair-matrix table.matrix tbody tr:first-child td.v').length === 40`, 10*time.Second)
	})

	t.Run("one peer's change shows", func(t *testing.T) {
		start := time.Now()
		f.markStale(ids[0], "operator: checking the page at 10,000 peers", "")
		b.waitFor(t, "peer-00000 stale and counted", stateOf(ids[0], "stale")+` && `+
			`(document.querySelector('#summary [data-count=state-stale] strong') || {}).textContent === '1'`, fleetUpdateBound)
		t.Logf("one peer's change shown at %d peers after %s", n, time.Since(start).Round(time.Millisecond))
		if !eval[bool](t, b, `window.__noReload === true`) {
			t.Error("the page reloaded to show the change")
		}
	})
	b.checkClean(t, "10,000 peers")
}

// routablePairs is how many pairs of the test's fleet are routable: per
// model 2,500 prefills and 2,500 decodes, of which 2,000 each have page 16
// and 500 page 32; pairs of equal page size are compatible.
func routablePairs() int {
	return 2 * (2000*2000 + 500*500)
}

// commas writes n as toLocaleString does in en-US.
func commas(n int) string {
	s := fmt.Sprint(n)
	var b bytes.Buffer
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// registerAll registers and then heartbeats every spec through the API,
// several at a time, and returns the peers' ids in the specs' order.
func (f *fixture) registerAll(specs []registry.PeerSpec) []string {
	f.t.Helper()
	const workers = 16
	ids := make([]string, len(specs))
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	next := make(chan int)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	post := func(path string, body any, want int, out any) error {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		req, err := http.NewRequest(http.MethodPost, f.url+path, bytes.NewReader(data))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminToken)
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		got, _ := io.ReadAll(res.Body)
		if res.StatusCode != want {
			return fmt.Errorf("POST %s = %d, want %d: %s", path, res.StatusCode, want, got)
		}
		if out != nil {
			return json.Unmarshal(got, out)
		}
		return nil
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				var p struct {
					ID string `json:"id"`
				}
				err := post("/api/v1/peers", apiconv.Registration(&specs[i]), http.StatusCreated, &p)
				if err == nil {
					ids[i] = p.ID
					l := apiconv.Load(registry.Load{})
					err = post("/api/v1/peers/"+p.ID+"/heartbeat", api.Heartbeat{InstanceId: specs[i].InstanceID, Load: &l}, http.StatusOK, nil)
				}
				if err != nil {
					errOnce.Do(func() { first = err })
				}
			}
		}()
	}
	for i := range specs {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		f.t.Fatal(first)
	}
	return ids
}
