package web_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pdplane/pdplane/registry"
)

// TestStatusPagePreflight: a pair's preflight shows in its detail (GB/s and
// latency when it passed), and a failed one turns the cell red with the
// backend's error, as the registry keeps the pair out of routing.
func TestStatusPagePreflight(t *testing.T) {
	chromium := chromiumPath(t)
	f := newFixture(t)
	p0, d0, _ := f.readyPair()
	report := func(pf registry.Preflight) {
		t.Helper()
		pf.PrefillID, pf.DecodeID, pf.Backend, pf.MemKind, pf.CheckedAt = p0, d0, "nixl", registry.DRAM, time.Now()
		if _, err := f.store.ReportPreflight(context.Background(), pf); err != nil {
			t.Fatal(err)
		}
	}
	report(registry.Preflight{State: registry.PreflightPassed, GBps: 2.5, LatencyUS: 19.5})

	b := newBrowser(t, chromium)
	b.do(t, chromedp.Navigate(f.url+"/"))
	cell := `#pair-matrix button[data-pair="` + p0 + ` ` + d0 + `"]`
	b.clickWhenThere(t, "the routable pair", `#pair-matrix td.v-routable button[data-pair="`+p0+` `+d0+`"]`, 10*time.Second)
	b.waitFor(t, "the passed preflight in the pair detail",
		`document.getElementById('pair-detail').textContent.includes('preflight passed (nixl, DRAM): 2.50 GB/s, 20 µs')`, 5*time.Second)

	const nixlErr = "preflight write of 4096 bytes: nixl_capi_check_remote_md: not found (-6)"
	report(registry.Preflight{State: registry.PreflightFailed, Error: nixlErr})
	b.waitFor(t, "the pair red with the preflight's error",
		`!!document.querySelector('#pair-matrix td.v-preflight') && `+
			`document.querySelector('`+cell+`').title.includes('preflight failed') && `+
			`document.getElementById('pair-detail').textContent.includes('preflight failed (nixl, DRAM): `+nixlErr+`') && `+
			`!!document.querySelector('#pair-counts [data-tally=preflight]')`, 10*time.Second)
	b.checkClean(t, "a failed preflight")

	// The pair's last exchange, as a serve replica reported it: in the
	// pair detail, and in each peer's detail as the partner it touched.
	if err := f.store.RecordExchanges(context.Background(), []registry.Exchange{{PrefillID: p0, DecodeID: d0, At: time.Now().Add(-3 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the last exchange in the pair detail", `document.getElementById('pair-detail').textContent.includes('last KV exchange ')`, 10*time.Second)
	b.clickWhenThere(t, "decode d0's name", `#peer-groups tr[data-peer-id=`+jsString(d0)+`] .peer-link`, 10*time.Second)
	b.waitFor(t, "d0's partner in its detail", `document.getElementById('peer-dialog').open && `+
		`(document.querySelector('#pd-body [data-partner=p0]') || {}).textContent?.startsWith('p0 (')`, 5*time.Second)
	b.checkClean(t, "a pair's last exchange")
}
