package web_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pdplane/pdplane/registry"
)

// TestStatusPageLiftQuarantine: the pair detail shows a quarantine, and
// its "Lift quarantine" button (with the admin token set at the top of the
// page) lifts it: the pair is routable again.
func TestStatusPageLiftQuarantine(t *testing.T) {
	chromium := chromiumPath(t)
	f := newFixture(t)
	p0, d0, dspec := f.readyPair()
	failed := func(agent string) map[string]string {
		return map[string]string{"reason": "p0 answered HTTP 500", "error": nixlError, "prefill_id": p0, "agent_name": agent}
	}
	f.call(http.MethodPost, "/api/v1/peers/"+d0+"/stale", adminToken, failed(dspec.Ranks[0].AgentName), http.StatusOK, nil)
	dspec.Ranks[0].AgentName += "-g2"
	f.reregister(dspec)
	f.heartbeat(d0, dspec.InstanceID, registry.Load{})
	f.call(http.MethodPost, "/api/v1/peers/"+d0+"/stale", adminToken, failed(dspec.Ranks[0].AgentName), http.StatusOK, nil)

	b := newBrowser(t, chromium)
	b.do(t, chromedp.Navigate(f.url+"/"))
	cell := `#pair-matrix td.v-quarantined button`
	b.waitFor(t, "the quarantined pair", `!!document.querySelector('`+cell+`')`, 10*time.Second)
	b.clickWhenThere(t, "the quarantined pair", cell, 10*time.Second)
	b.waitFor(t, "the quarantine in the pair detail", `document.querySelector('#pair-detail .quarantine') && `+
		`document.getElementById('pair-detail').textContent.includes('until an operator lifts it')`, 5*time.Second)
	if eval[bool](t, b, `!!document.querySelector('#pair-detail [data-lift-pair]')`) {
		t.Error("the lift button is offered before an admin token is set")
	}

	// The pair stays pinned while the operator sets the token.
	b.do(t, chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.CSS(`#token-form button[type=submit]`)))
	b.waitFor(t, "the lift button", `!!document.querySelector('#pair-detail [data-lift-pair]')`, 5*time.Second)
	b.clickWhenThere(t, "the lift button", `#pair-detail [data-lift-pair]`, 10*time.Second)
	b.waitFor(t, "the pair routable again", `!!document.querySelector('#pair-matrix td.v-routable button') && `+
		`!document.querySelector('#pair-matrix td.v-quarantined')`, 10*time.Second)
	b.waitFor(t, "the lift in the event timeline", `!!document.querySelector('#event-list .kind-quarantine_lifted')`, 10*time.Second)

	var pairs struct {
		Pairs []struct {
			Routable   bool `json:"routable"`
			Quarantine any  `json:"quarantine"`
		} `json:"pairs"`
	}
	f.call(http.MethodGet, "/api/v1/pairs", "", nil, http.StatusOK, &pairs)
	if len(pairs.Pairs) != 1 || !pairs.Pairs[0].Routable || pairs.Pairs[0].Quarantine != nil {
		t.Fatalf("pairs after the lift: %+v", pairs)
	}
	b.checkClean(t, "after lifting a quarantine")
}
