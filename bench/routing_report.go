package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Print writes the report: per workload, what was sent and to which fleet,
// then one Markdown table row per router.
func (r *RoutingReport) Print(w io.Writer) {
	c := r.Config
	for _, run := range r.Runs {
		wl := run.Workload
		s := wl.Spec
		total, systems := wl.DistinctTokens()
		fmt.Fprintf(w, "Routing quality, %s workload (seed %d): %d requests, mean prompt %s tokens", s.Kind, s.Seed, len(wl.Requests), thousands(wl.MeanTokens()))
		if s.Kind == WorkloadPrefixHeavy {
			fmt.Fprintf(w, "; %d system prompts of %v tokens shared by %d conversations (Zipf popularity, s=%.2f) of %v turns, %d under way at once, each turn re-sending the history (answers of %v tokens) and a new message of %v tokens",
				s.SystemPrompts, s.SystemTokens, wl.Conversations, s.ZipfS, s.Turns, s.Open, s.AnswerTokens, s.UserTokens)
		} else {
			fmt.Fprint(w, "; every prompt fresh random text, of the prefix-heavy workload's lengths")
		}
		fmt.Fprintf(w, "; streamed /v1/completions of %d tokens.\n\n", c.MaxTokens)
		capTokens := c.CachePages * c.PageSize
		fmt.Fprintf(w, "Each router on a fleet of its own, started cold: %s and %s (pdplane sim --cheap-transfer, --prefill-time-per-token %v on uncached tokens only, --prefill-slots %d), SGLang sims",
			plural(c.Prefills, "prefill"), plural(c.Decodes, "decode"), c.PrefillTimePerToken, c.PrefillSlots)
		if slices.ContainsFunc(run.Results, func(r RouterResult) bool { return r.Engine == "vllm" }) {
			fmt.Fprint(w, ", but vllm-router's are vLLM sims (vLLM's PD protocol runs the prefill before the decode, so its TTFT is not comparable to the others')")
		}
		fmt.Fprintf(w, ". Prefix cache: %s pages of %d tokens = %s tokens a prefill, %s in the fleet; the workload's distinct prompt tokens: %s",
			thousands(float64(c.CachePages)), c.PageSize, thousands(float64(capTokens)), thousands(float64(capTokens*c.Prefills)), thousands(float64(total)))
		if systems > 0 {
			fmt.Fprintf(w, " (%s of them system prompts)", thousands(float64(systems)))
		}
		fmt.Fprintf(w, ".\n\nOffered load: Poisson arrivals at %.2f req/s = %.2f × the fleet's prefill capacity with no cache hit (%s × %s / (%s tokens × %v) = %.2f req/s)",
			run.Rate, c.Load, plural(c.Prefills, "prefill"), plural(c.PrefillSlots, "slot"), thousands(wl.MeanTokens()), c.PrefillTimePerToken, run.CapacityRPS)
		if s.Kind == WorkloadPrefixHeavy {
			fmt.Fprint(w, "; a conversation's next turn waits for the previous answer")
		}
		fmt.Fprint(w, ".\n\n")
		fmt.Fprintln(w, "| router | engines | policy | hit rate | prefill tokens / request | TTFT p50 | TTFT p99 | e2e p99 | req/s | failed |")
		fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, res := range run.Results {
			if res.Err != "" {
				fmt.Fprintf(w, "| %s | %s | %s | not measured | | | | | | |\n", res.Router, engineTitle(res.Engine), res.Policy)
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.1f %% | %s | %s | %s | %s | %.2f | %d |\n", res.Router, engineTitle(res.Engine), res.Policy,
				100*res.HitRate(), thousands(res.PrefillTokensPerRequest()), fmtDur(res.TTFTPercentile(50)), fmtDur(res.TTFTPercentile(99)),
				fmtDur(res.E2EPercentile(99)), res.RPS(), res.Failed)
		}
		fmt.Fprintln(w)
		for _, res := range run.Results {
			switch {
			case res.Err != "":
				fmt.Fprintf(w, "%s was not measured: %s\n", res.Router, tail(res.Err, 2000))
			case res.FirstError != "":
				fmt.Fprintf(w, "%s, first failure: %s\n", res.Router, res.FirstError)
			}
		}
		fmt.Fprintln(w)
	}
}

// plural is n and the noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// thousands prints x rounded, with a comma every three digits.
func thousands(x float64) string {
	n := int64(math.Round(x))
	if n < 0 {
		return "-" + thousands(float64(-n))
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// RouterFigures is one router's figures in the report's JSON.
type RouterFigures struct {
	HitRate                 float64 `json:"hit_rate"`
	PrefillTokensPerRequest float64 `json:"prefill_tokens_per_request"`
	TTFTP50ms               float64 `json:"ttft_p50_ms"`
	TTFTP99ms               float64 `json:"ttft_p99_ms"`
	E2EP99ms                float64 `json:"e2e_p99_ms"`
	RPS                     float64 `json:"rps"`
	Failed                  int     `json:"failed"`
	// Error is why the router was not measured; absent when it was.
	Error string `json:"error,omitempty"`
}

// RoutersJSON is one workload's figures in the report's JSON.
type RoutersJSON struct {
	Routers map[string]RouterFigures `json:"routers"`
}

// WriteJSON writes the report as JSON: {"routers": {"<router>": {...}}}
// for one workload; with several, {"workloads": {"<workload>": {"routers":
// {...}}}}.
func (r *RoutingReport) WriteJSON(w io.Writer) error {
	byWorkload := map[string]RoutersJSON{}
	for _, run := range r.Runs {
		rj := RoutersJSON{Routers: map[string]RouterFigures{}}
		for _, res := range run.Results {
			rj.Routers[res.Router] = res.figures()
		}
		byWorkload[run.Workload.Spec.Kind] = rj
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if len(r.Runs) == 1 {
		return enc.Encode(byWorkload[r.Runs[0].Workload.Spec.Kind])
	}
	return enc.Encode(struct {
		Workloads map[string]RoutersJSON `json:"workloads"`
	}{byWorkload})
}

func (r RouterResult) figures() RouterFigures {
	if r.Err != "" {
		return RouterFigures{Error: tail(strings.TrimSpace(r.Err), 500)}
	}
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
	round := func(x float64, digits float64) float64 { p := math.Pow(10, digits); return math.Round(x*p) / p }
	return RouterFigures{
		HitRate: round(r.HitRate(), 4), PrefillTokensPerRequest: round(r.PrefillTokensPerRequest(), 1),
		TTFTP50ms: ms(r.TTFTPercentile(50)), TTFTP99ms: ms(r.TTFTPercentile(99)), E2EP99ms: ms(r.E2EPercentile(99)),
		RPS: round(r.RPS(), 3), Failed: r.Failed,
	}
}
