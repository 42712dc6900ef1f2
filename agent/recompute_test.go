package agent

import (
	"testing"
	"time"
)

// TestRecomputeWindow: a PD decode computes one prompt token per request,
// which is not recompute; what it computes beyond that is, over the window
// only; in-flight requests may each have computed their token; a restarted
// engine's counters start the window afresh.
func TestRecomputeWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := recomputeWindow{window: 30 * time.Second}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	check := func(what string, got Recompute, recomputed, prompt int64) {
		t.Helper()
		if got.Recomputed != recomputed || got.Prompt != prompt {
			t.Errorf("%s: %+v, want %d recomputed of %d", what, got, recomputed, prompt)
		}
	}
	check("first sample", w.add(at(0), promptSources{computed: 5, transferred: 100, requests: 5}), 0, 0)
	// 10 requests of 50 tokens: 49 each loaded, 1 computed.
	check("healthy PD traffic", w.add(at(10), promptSources{computed: 15, transferred: 590, requests: 15}), 0, 500)
	// Two of them still running: their last token is computed, they have
	// not finished.
	check("requests in flight", w.add(at(12), promptSources{computed: 17, transferred: 688, requests: 15, inFlight: 2}), 0, 600)
	// They finish; then 4 requests of 50 tokens are computed whole.
	r := w.add(at(20), promptSources{computed: 217, transferred: 688, requests: 21})
	check("recompute", r, 196, 800)
	if r.Window != 20*time.Second || r.Fraction() < 0.24 || r.Fraction() > 0.25 {
		t.Errorf("recompute over %s: fraction %v", r.Window, r.Fraction())
	}
	// 40 s on, the samples older than the window are gone: the baseline is
	// the newest sample at least 30 s old (at 10 s).
	check("window moved", w.add(at(40), promptSources{computed: 217, transferred: 688, requests: 21}), 196, 300)
	check("window moved on", w.add(at(55), promptSources{computed: 218, transferred: 737, requests: 22}), 0, 50)
	// The engine restarted: its counters went back.
	check("restarted engine", w.add(at(60), promptSources{computed: 1, transferred: 49, requests: 1}), 0, 0)
	check("after the restart", w.add(at(61), promptSources{computed: 51, transferred: 49, requests: 2}), 49, 50)
}
