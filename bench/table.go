package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// engineTitle names an engine kind in the table.
func engineTitle(engine string) string {
	if engine == "vllm" {
		return "vLLM PD"
	}
	return "SGLang PD"
}

// Print writes the report as one Markdown table per comparison: each
// router's figures and, with a peer, the ratio pdplane / peer (below 1 is
// pdplane spending or waiting less, above 1 for req/s is pdplane serving
// more).
func (r *Report) Print(w io.Writer) {
	for _, c := range r.Comparisons {
		peer := c.Peer
		title := "pdplane alone"
		if peer != "" {
			title = "pdplane vs " + peer
		}
		fmt.Fprintf(w, "%s: %s engines (pdplane sim --cheap-transfer), %d round(s) of %v windows per router\n\n",
			title, engineTitle(c.Engine), r.Config.Rounds, r.Config.Window)
		t := &table{peer: peer}
		for _, row := range c.Rows {
			what := fmt.Sprintf("%s, %d clients", row.Mode, row.Concurrency)
			var ps Stats
			if row.Peer != nil {
				ps = *row.Peer
			}
			t.add(what+": req/s", row.Pdplane.ReqPerSec(), ps.ReqPerSec(), fmt.Sprintf("%.0f", row.Pdplane.ReqPerSec()), fmt.Sprintf("%.0f", ps.ReqPerSec()))
			t.dur(what+": TTFT p50", row.Pdplane.TTFT50, ps.TTFT50)
			t.dur(what+": TTFT p99", row.Pdplane.TTFT99, ps.TTFT99)
			t.dur(what+": CPU per request", row.Pdplane.CPUPerRequest(), ps.CPUPerRequest())
			t.add(what+": failed", 0, 0, fmt.Sprint(row.Pdplane.Failed), fmt.Sprint(ps.Failed))
		}
		if c.HeldPdplane != nil {
			hp, hq := *c.HeldPdplane, Held{}
			if c.HeldPeer != nil {
				hq = *c.HeldPeer
			}
			what := fmt.Sprintf("held streams (%d opened on a slow decode)", hp.Opened)
			t.add(what+": held", 0, 0, fmt.Sprint(hp.Held), fmt.Sprint(hq.Held))
			t.add("RSS per held stream", hp.RSSPerStream, hq.RSSPerStream, kib(hp.RSSPerStream), kib(hq.RSSPerStream))
			t.add("fds per held stream", hp.FDsPerStream, hq.FDsPerStream, fmt.Sprintf("%.2f", hp.FDsPerStream), fmt.Sprintf("%.2f", hq.FDsPerStream))
			t.add("RSS before the streams", float64(hp.RSSBase), float64(hq.RSSBase), kib(float64(hp.RSSBase)), kib(float64(hq.RSSBase)))
		}
		t.print(w)
		for _, row := range c.Rows {
			if row.Pdplane.FirstError != "" {
				fmt.Fprintf(w, "pdplane, %s %d clients, first failure: %s\n", row.Mode, row.Concurrency, row.Pdplane.FirstError)
			}
			if row.Peer != nil && row.Peer.FirstError != "" {
				fmt.Fprintf(w, "%s, %s %d clients, first failure: %s\n", peer, row.Mode, row.Concurrency, row.Peer.FirstError)
			}
		}
		for who, h := range map[string]*Held{"pdplane": c.HeldPdplane, peer: c.HeldPeer} {
			if h != nil && h.FirstError != "" {
				fmt.Fprintf(w, "%s, held streams, first failure: %s\n", who, h.FirstError)
			}
		}
		fmt.Fprintln(w)
	}
}

// table accumulates rows of (metric, pdplane, peer, ratio).
type table struct {
	peer string
	rows [][]string
}

// add appends a row; the ratio is a/b when both are positive.
func (t *table) add(what string, a, b float64, as, bs string) {
	ratio := ""
	if a > 0 && b > 0 {
		ratio = fmt.Sprintf("%.2f", a/b)
	}
	t.rows = append(t.rows, []string{what, as, bs, ratio})
}

func (t *table) dur(what string, a, b time.Duration) {
	t.add(what, float64(a), float64(b), fmtDur(a), fmtDur(b))
}

func (t *table) print(w io.Writer) {
	if t.peer == "" {
		fmt.Fprintln(w, "| | pdplane |\n|---|---:|")
		for _, r := range t.rows {
			fmt.Fprintf(w, "| %s | %s |\n", r[0], r[1])
		}
		return
	}
	fmt.Fprintf(w, "| | pdplane | %s | pdplane / %s |\n|---|---:|---:|---:|\n", t.peer, t.peer)
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}

// fmtDur prints d to three significant figures in µs or ms.
func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
}

// kib prints a byte count in KiB, or MiB from 10 MiB up.
func kib(b float64) string {
	if b >= 10<<20 {
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", b/1024)
}
