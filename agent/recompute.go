package agent

import (
	"fmt"
	"time"
)

// A vLLM decode that cannot load a prompt's KV from its prefill computes
// the prompt itself when its operator chose kv_load_failure_policy=
// recompute: the client gets its answer, later, and only the decode's
// counters tell. In vLLM 0.32, v1/core/sched/scheduler.py
// _handle_failed_recving sets such a request's num_computed_tokens to 0
// (and _update_requests_with_invalid_blocks truncates it at the first bad
// block), and v1/metrics/stats.py counts a prompt's tokens by where they
// came from: PrefillStats computed = prompt − cached, summed by
// PromptTokenStats into source="local_compute", the loaded ones into
// "external_kv_transfer". Of a PD request whose load succeeded the decode
// computes at most the prompt's last token (_update_waiting_for_remote_kv
// sets num_computed_tokens to num_tokens − 1 on a full hit; a real decode
// computed none of 386 in realengine's TestVLLM), so what it computed
// beyond one token per request it served was recomputed KV. The figures
// are per decode: they cannot say which prefill's loads failed. The report
// names the pair when the decode exchanged KV with one prefill only over
// the window, as the routers reported the pairs they served
// (Agent.onlyPartner); else it names the decode.

// Recompute defaults: a decode recomputing more than 5 % of its prompt
// tokens over 30 s is flagged, once it took in at least 64 prompt tokens in
// that time (a few short prompts say nothing).
const (
	DefaultRecomputeWindow    = 30 * time.Second
	DefaultRecomputeThreshold = 0.05
	DefaultRecomputeMinTokens = 64
)

// RecomputeReason is the reason of the report an agent makes of a decode
// that recomputes KV.
const RecomputeReason = "KV recomputed by the decode"

// promptSources are a vLLM engine's cumulative prompt-token and
// finished-request counters, and the requests it holds now (each may have
// had its last prompt token computed and not finished yet).
type promptSources struct {
	computed, transferred, requests float64
	inFlight                        int
}

// Recompute is what a decode's counters say of the prompt tokens it took
// in over the recent window.
type Recompute struct {
	// Recomputed prompt tokens: computed locally beyond the last token of
	// each request (those in flight counted as if each had computed one).
	Recomputed int64
	// Prompt tokens the decode took in: computed and loaded by KV
	// transfer.
	Prompt int64
	// Window is the time the figures cover.
	Window time.Duration
}

// Fraction is the share of the prompt tokens that were recomputed.
func (r Recompute) Fraction() float64 {
	if r.Prompt <= 0 {
		return 0
	}
	return float64(r.Recomputed) / float64(r.Prompt)
}

func (r Recompute) String() string {
	return fmt.Sprintf("%d of %d prompt tokens (%.1f%%) computed by the decode instead of loaded by KV transfer over %s",
		r.Recomputed, r.Prompt, 100*r.Fraction(), r.Window.Round(time.Second))
}

// recomputeWindow keeps the counter samples of the last window.
type recomputeWindow struct {
	window  time.Duration
	samples []recomputeSample // oldest first
}

type recomputeSample struct {
	at time.Time
	promptSources
}

// add records a sample and returns the figures from the oldest sample kept
// to it. A counter that went back means a restarted engine: what came
// before says nothing of this one.
func (w *recomputeWindow) add(at time.Time, s promptSources) Recompute {
	if n := len(w.samples); n > 0 {
		last := w.samples[n-1]
		if s.computed < last.computed || s.transferred < last.transferred || s.requests < last.requests {
			w.samples = w.samples[:0]
		}
	}
	w.samples = append(w.samples, recomputeSample{at, s})
	// Keep the newest sample at least a window old as the baseline.
	drop := 0
	for drop+1 < len(w.samples) && !w.samples[drop+1].at.After(at.Add(-w.window)) {
		drop++
	}
	w.samples = w.samples[drop:]
	first := w.samples[0]
	computed := s.computed - first.computed
	r := Recompute{
		Recomputed: int64(max(computed-(s.requests-first.requests)-float64(s.inFlight), 0)),
		Prompt:     int64(computed + s.transferred - first.transferred),
		Window:     at.Sub(first.at),
	}
	r.Recomputed = min(r.Recomputed, r.Prompt)
	return r
}

// reset forgets the samples: what follows is judged afresh.
func (w *recomputeWindow) reset() { w.samples = w.samples[:0] }

// forgetRecompute starts the recompute window afresh.
func (p *EngineProbe) forgetRecompute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recompute.reset()
	p.st.Recompute, p.st.Recomputing = Recompute{}, false
}
