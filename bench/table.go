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
		fmt.Fprintf(w, "%s: %s engines (pdplane sim --cheap-transfer, 1 KiB pages), %d round(s) of %v windows per router\n\n",
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
			t.dur(what+": engines' CPU per request", row.Pdplane.EngineCPUPerRequest(), ps.EngineCPUPerRequest())
			t.add(what+": failed", 0, 0, fmt.Sprint(row.Pdplane.Failed), fmt.Sprint(ps.Failed))
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
		fmt.Fprintln(w)
		if len(c.HeldPdplane) > 0 {
			r.printHeld(w, c)
		}
	}
}

// printHeld writes the held-stream levels of c as one table: per router
// and level, the streams held, the router's memory and descriptors per
// stream, the time to first token of new requests sent meanwhile, and
// their p99 against the router's smallest level.
func (r *Report) printHeld(w io.Writer, c Comparison) {
	fmt.Fprintf(w, "Held streams (a slow decode, a token every %v on each; open-files limit %d); new requests while they are held: %d clients for %d windows of %v, %d token(s) each; TTFT p99 is the median window's\n\n",
		r.Config.HeldTokenTime, r.FDLimit, r.Config.ProbeClients, r.Config.ProbeRounds, r.Config.ProbeWindow, probeTokens)
	fmt.Fprintln(w, "| router | held | RSS per stream | fds per stream | new requests | TTFT p50 | TTFT p99 | p99 / smallest level's | p99 of each window | sims' RSS | load (1 min) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var failures []string
	for _, who := range []struct {
		name string
		hs   []Held
	}{{"pdplane", c.HeldPdplane}, {c.Peer, c.HeldPeer}} {
		for _, h := range who.hs {
			ratio := "—"
			if first := who.hs[0].Probe.TTFT99; first > 0 && h.Probe.TTFT99 > 0 {
				ratio = fmt.Sprintf("%.2f", float64(h.Probe.TTFT99)/float64(first))
			}
			windows := make([]string, len(h.WindowP99s))
			for i, d := range h.WindowP99s {
				windows[i] = fmtDur(d)
			}
			fmt.Fprintf(w, "| %s | %d of %d | %s | %.2f | %d ok, %d failed | %s | %s | %s | %s | %s | %s |\n", who.name, h.Held, h.Opened,
				kib(h.RSSPerStream), h.FDsPerStream, h.Probe.Requests, h.Probe.Failed, fmtDur(h.Probe.TTFT50), fmtDur(h.Probe.TTFT99), ratio,
				strings.Join(windows, ", "), kib(float64(h.EnginesRSS)), h.LoadAvg)
			if h.FirstError != "" {
				failures = append(failures, fmt.Sprintf("%s, %d held streams, first stream not held: %s", who.name, h.Opened, h.FirstError))
			}
			if h.Probe.FirstError != "" {
				failures = append(failures, fmt.Sprintf("%s, %d held streams, first new request failed: %s", who.name, h.Opened, h.Probe.FirstError))
			}
		}
	}
	fmt.Fprintln(w)
	for who, hs := range map[string][]Held{"pdplane": c.HeldPdplane, c.Peer: c.HeldPeer} {
		if len(hs) > 0 {
			fmt.Fprintf(w, "%s before the streams: RSS %s, %d fds; every level counted from there.\n", who, kib(float64(hs[0].RSSBase)), hs[0].FDsBase)
		}
	}
	for _, f := range failures {
		fmt.Fprintln(w, f)
	}
	fmt.Fprintln(w)
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
