package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// The plot's geometry, in SVG user units: one row per workload, the TTFT
// CDF on the left, the hit rates on the right.
const (
	plotWidth   = 1000
	plotTitleH  = 50
	plotRowH    = 400
	cdfLeft     = 70
	cdfRight    = 620
	barsLeft    = 720
	barsRight   = 970
	panelTop    = 40  // from the row's top
	panelBottom = 320 // from the row's top
)

// plotColours are the routers' colours, in the order of the report's
// routers (Okabe–Ito, told apart by colour-blind readers).
var plotColours = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000"}

// WriteSVG draws the report as one self-contained SVG page: for each
// workload, every measured router's client-side TTFT as a cumulative
// distribution (log-scale time) and its prefix cache hit rate as a bar.
// Each router's curve is a polyline and its bar a rect, both with class
// "cdf" or "hit" and data-router naming the router.
func (r *RoutingReport) WriteSVG(w io.Writer) error {
	var b bytes.Buffer
	height := plotTitleH + plotRowH*max(len(r.Runs), 1)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotWidth, height, plotWidth, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotWidth, height)
	c := r.Config
	svgText(&b, plotWidth/2, 28, "middle", 15, fmt.Sprintf("pdplane bench routing: %d prefills + %d decodes a router, %v a prefill token, cache of %s tokens a prefill, load %.2f",
		c.Prefills, c.Decodes, c.PrefillTimePerToken, thousands(float64(c.CachePages*c.PageSize)), c.Load))
	for i, run := range r.Runs {
		plotRun(&b, run, plotTitleH+i*plotRowH)
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// plotRun draws one workload's row with its top at top.
func plotRun(b *bytes.Buffer, run WorkloadRun, top int) {
	y0, y1 := float64(top+panelTop), float64(top+panelBottom)
	svgText(b, (cdfLeft+cdfRight)/2, top+panelTop-12, "middle", 14,
		fmt.Sprintf("%s: time to first token, cumulative share of requests (%.2f req/s offered)", run.Workload.Spec.Kind, run.Rate))
	lo, hi := ttftRange(run.Results)
	lx, hx := math.Log10(lo), math.Log10(hi)
	x := func(ms float64) float64 { return cdfLeft + (math.Log10(ms)-lx)/(hx-lx)*(cdfRight-cdfLeft) }
	y := func(share float64) float64 { return y1 - share*(y1-y0) }
	// Axes and grid.
	fmt.Fprintf(b, `<rect x="%d" y="%.0f" width="%d" height="%.0f" fill="none" stroke="#888"/>`+"\n", cdfLeft, y0, cdfRight-cdfLeft, y1-y0)
	for _, t := range logTicks(lo, hi) {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", x(t), y0, x(t), y1)
		svgText(b, int(x(t)), int(y1)+16, "middle", 11, fmtMS(t))
	}
	svgText(b, (cdfLeft+cdfRight)/2, int(y1)+34, "middle", 12, "TTFT, ms (log scale)")
	for _, s := range []float64{0, 0.25, 0.5, 0.75, 1} {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", cdfLeft, y(s), cdfRight, y(s))
		svgText(b, cdfLeft-6, int(y(s))+4, "end", 11, fmt.Sprintf("%.0f%%", 100*s))
	}
	// One curve per measured router, and its legend entry.
	legendY, legendX := int(y1)+50, cdfLeft
	for i, res := range run.Results {
		colour := plotColours[i%len(plotColours)]
		if res.Err != "" || len(res.TTFT) == 0 {
			label := res.Router + ": not measured"
			svgText(b, legendX, legendY+4, "start", 11, label)
			legendX += 20 + 7*len(label)
			continue
		}
		fmt.Fprintf(b, `<polyline class="cdf" data-router="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n",
			esc(res.Router), colour, cdfPoints(res.TTFT, x, y))
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", legendX, legendY, legendX+18, legendY, colour)
		svgText(b, legendX+22, legendY+4, "start", 11, res.Router)
		legendX += 42 + 7*len(res.Router)
	}
	// Hit rates as bars.
	svgText(b, (barsLeft+barsRight)/2, top+panelTop-12, "middle", 14, "prefix cache hit rate")
	fmt.Fprintf(b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#888"/>`+"\n", barsLeft, y1, barsRight, y1)
	for _, s := range []float64{0, 0.5, 1} {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", barsLeft, y(s), barsRight, y(s))
		svgText(b, barsLeft-6, int(y(s))+4, "end", 11, fmt.Sprintf("%.0f%%", 100*s))
	}
	n := max(len(run.Results), 1)
	slot := float64(barsRight-barsLeft) / float64(n)
	for i, res := range run.Results {
		cx := barsLeft + slot*(float64(i)+0.5)
		if res.Err == "" {
			h := res.HitRate()
			fmt.Fprintf(b, `<rect class="hit" data-router="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n",
				esc(res.Router), cx-slot*0.35, y(h), slot*0.7, y(0)-y(h), plotColours[i%len(plotColours)])
			svgText(b, int(cx), int(y(h))-4, "middle", 11, fmt.Sprintf("%.1f%%", 100*h))
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="end" font-size="11" transform="rotate(-35 %.1f %.0f)">%s</text>`+"\n",
			cx, y1+14, cx, y1+14, esc(res.Router))
	}
}

// ttftRange is the TTFT range (ms) the CDFs span, widened to the 1, 2 or
// 5 of a decade below and above; 1–1000 ms when there is none.
func ttftRange(rs []RouterResult) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		for _, d := range r.TTFT {
			ms := float64(d) / float64(time.Millisecond)
			lo, hi = min(lo, ms), max(hi, ms)
		}
	}
	if math.IsInf(lo, 1) {
		return 1, 1000
	}
	lo, hi = max(lo, 0.01), max(hi, 0.01)
	lo, hi = step125(lo, false), step125(hi, true)
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

// step125 is the largest 1, 2 or 5 of a decade at most x, or with up the
// smallest at least x.
func step125(x float64, up bool) float64 {
	d := math.Pow(10, math.Floor(math.Log10(x)))
	steps := []float64{d, 2 * d, 5 * d, 10 * d}
	if up {
		for _, s := range steps {
			if s >= x*0.9999 {
				return s
			}
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if steps[i] <= x*1.0001 {
			return steps[i]
		}
	}
	return d
}

// logTicks are 1, 2 and 5 of each decade from lo to hi.
func logTicks(lo, hi float64) []float64 {
	var out []float64
	for d := math.Pow(10, math.Floor(math.Log10(lo)+1e-9)); d <= hi*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if t := d * m; t >= lo*0.9999 && t <= hi*1.0001 {
				out = append(out, t)
			}
		}
	}
	return out
}

// cdfPoints is the empirical CDF of ds as a step line, at most ~1,000
// steps.
func cdfPoints(ds []time.Duration, x, y func(float64) float64) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	step := max(1, len(s)/1000)
	var b strings.Builder
	prev := 0.0
	for i := 0; i < len(s); i += step {
		j := min(i+step, len(s)) - 1
		ms := float64(s[j]) / float64(time.Millisecond)
		share := float64(j+1) / float64(len(s))
		fmt.Fprintf(&b, "%.1f,%.1f %.1f,%.1f ", x(max(ms, 0.01)), y(prev), x(max(ms, 0.01)), y(share))
		prev = share
	}
	return strings.TrimSpace(b.String())
}

func fmtMS(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%gs", ms/1000)
	}
	return fmt.Sprintf("%g", ms)
}

func svgText(b *bytes.Buffer, x, y int, anchor string, size int, s string) {
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="%s" font-size="%d">%s</text>`+"\n", x, y, anchor, size, esc(s))
}

// esc escapes s for an SVG text node.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
