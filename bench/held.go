package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// Held is one router's figures at one level of held streams: what the
// streams cost it, and how new requests fared while they were held.
type Held struct {
	Opened, Held int
	// FirstError is why the first stream that was not held failed.
	FirstError string
	// RSSBase and FDsBase are the router's before the first level's
	// streams opened. Every level is counted from them, so that memory a
	// level kept after its streams closed counts against the next level
	// rather than in its favour.
	RSSBase int64
	FDsBase int
	// RSS and FDs are the router's with the level's streams held.
	RSS int64
	FDs int
	// RSSPerStream and FDsPerStream are (value with Held streams − base)
	// / Held.
	RSSPerStream float64
	FDsPerStream float64
	// Probe is the new streamed requests sent through the router while
	// the streams were held (Config.ProbeClients clients for
	// Config.ProbeRounds windows of Config.ProbeWindow, probeTokens tokens
	// each): requests, failures, time to first token (p50 over all of
	// them, p99 the median of the windows' p99s, WindowP99s).
	Probe Stats
	// WindowP99s is each probe window's p99, in order.
	WindowP99s []time.Duration
	// EnginesRSS is the prefill's and the decode's resident memory
	// together with the streams held, their KV pools included.
	EnginesRSS int64
	// LoadAvg is the machine's 1-minute load average after the probe:
	// what else ran beside it.
	LoadAvg string
}

const (
	// heldTokens is the length of a held stream: at one token a second
	// (Config.HeldTokenTime), it outlasts the measurement by far (the
	// streams are closed after it).
	heldTokens = 3600
	// heldSettleExtra and heldSettleMax: how long after the last stream
	// opened its router's memory is read: one token time and a little
	// more, so that each stream has waited for its second token, at most
	// heldSettleMax (held streams with a long token time are read before).
	heldSettleExtra = 500 * time.Millisecond
	heldSettleMax   = 5 * time.Second
	// heldOpenTimeout bounds how long a level's streams may take to open.
	heldOpenTimeout = 3 * time.Minute
	// heldReleaseTimeout bounds the wait for the router to let go of a
	// level's connections before the next level opens.
	heldReleaseTimeout = 30 * time.Second
	// probeTokens is the length of a probe request. An SGLang decode sends
	// its first token as soon as the KV is in (the prefill computed it),
	// so one token measures the router's path, not the slow decode; a vLLM
	// decode computes it and adds its per-token time.
	probeTokens = 1
	// routerPoolFDs is what a router may keep besides the streams: its
	// idle connections to the engines (pdplane keeps up to 512) and its
	// listeners, logs and pipes.
	routerPoolFDs = 576
)

// measureHeldLevels holds each level of cfg.HeldStreams in turn through t
// on the slow fleet f: it opens the streams, reads the router's memory and
// descriptors, sends the probe of new requests while they are held, and
// releases them before the next level.
func measureHeldLevels(ctx context.Context, cfg Config, f *fleet, t target) ([]Held, error) {
	base, err := ReadUsage(t.proc.PID())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.name, err)
	}
	var out []Held
	for _, n := range cfg.HeldStreams {
		h, err := measureHeld(ctx, cfg, f, t, base, n)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// measureHeld is one level: n streams held through t, counted from base.
func measureHeld(ctx context.Context, cfg Config, f *fleet, t target, base Usage, n int) (Held, error) {
	fmt.Fprintf(cfg.Progress, "bench: %s: holding %d streams on a slow decode\n", t.name, n)
	hs, err := holdStreams(ctx, f.load(t, Stream, heldTokens), n, heldOpenTimeout)
	if err != nil {
		return Held{}, err
	}
	defer hs.Release()
	// Memory is read in the streams' steady state: once each has waited
	// for its next token at least once, as a held stream spends its life
	// (pdplane moves a stream off net/http's connection at its first
	// slow wait: router/takeover.go). Every router gets the same wait.
	select {
	case <-time.After(min(cfg.HeldTokenTime+heldSettleExtra, heldSettleMax)):
	case <-ctx.Done():
		return Held{}, ctx.Err()
	}
	with, err := ReadUsage(t.proc.PID())
	if err != nil {
		return Held{}, fmt.Errorf("%s: %w", t.name, err)
	}
	h := Held{Opened: n, Held: hs.Held, FirstError: hs.FirstError, RSSBase: base.RSS, FDsBase: base.FDs, RSS: with.RSS, FDs: with.FDs}
	if hs.Held > 0 {
		d := with.Sub(base)
		h.RSSPerStream = float64(d.RSS) / float64(hs.Held)
		h.FDsPerStream = float64(d.FDs) / float64(hs.Held)
	}
	engines := engineUsage(t)
	h.EnginesRSS = engines.RSS
	h.Probe, h.WindowP99s = probe(ctx, cfg, f.load(t, Stream, probeTokens), t)
	h.LoadAvg = loadAvg()
	share := func(cpu time.Duration) float64 { return 100 * cpu.Seconds() / h.Probe.Elapsed.Seconds() }
	fmt.Fprintf(cfg.Progress, "bench: %s: %d of %d streams held, RSS %+d KiB, fds %+d; new requests: %d ok, %d failed, TTFT p50 %v p99 %v; "+
		"CPU meanwhile: router %.0f%%, sims %.0f%% of a core; load %s\n",
		t.name, hs.Held, n, (with.RSS-base.RSS)>>10, with.FDs-base.FDs, h.Probe.Requests, h.Probe.Failed, h.Probe.TTFT50, h.Probe.TTFT99,
		share(h.Probe.CPU), share(engineUsage(t).CPU-engines.CPU), h.LoadAvg)
	hs.Release()
	// The next level starts once the router has let go of this one's
	// connections (its idle pools may keep some).
	if fds, ok := waitFDs(ctx, t.proc.PID(), base.FDs+2*cfg.ProbeClients+routerPoolFDs, heldReleaseTimeout); !ok {
		fmt.Fprintf(cfg.Progress, "bench: %s: still %d fds %v after the %d streams closed (%d before them)\n",
			t.name, fds, heldReleaseTimeout, n, base.FDs)
	}
	return h, nil
}

// probe sends l from cfg.ProbeClients clients through t for
// cfg.ProbeRounds windows of cfg.ProbeWindow and returns what they
// measured, the router's CPU over them included, and each window's p99.
func probe(ctx context.Context, cfg Config, l Load, t target) (Stats, []time.Duration) {
	before, _ := ReadUsage(t.proc.PID())
	start := time.Now()
	var s Stats
	var all, p99s []time.Duration
	for range cfg.ProbeRounds {
		res := runWindow(ctx, l, cfg.ProbeClients, cfg.ProbeWindow)
		s.Requests, s.Failed = s.Requests+res.OK, s.Failed+res.Failed
		s.FirstError = cmp.Or(s.FirstError, res.FirstError)
		all = append(all, res.TTFT...)
		if len(res.TTFT) > 0 {
			p99s = append(p99s, percentile(res.TTFT, 99))
		}
	}
	s.Elapsed, s.TTFT50 = time.Since(start), percentile(all, 50)
	s.TTFT99 = percentile(p99s, 50) // the median window's (the lower of two middle ones)
	if after, err := ReadUsage(t.proc.PID()); err == nil {
		s.CPU = after.CPU - before.CPU
	}
	return s, p99s
}

// engineUsage sums the usage of the engines behind t (what cannot be read
// counts as nothing: the figure is informative).
func engineUsage(t target) Usage {
	var sum Usage
	for _, s := range t.engines {
		if u, err := ReadUsage(s.PID()); err == nil {
			sum.CPU, sum.RSS, sum.FDs = sum.CPU+u.CPU, sum.RSS+u.RSS, sum.FDs+u.FDs
		}
	}
	return sum
}

// loadAvg is the 1-minute load average from /proc/loadavg, "?" when it
// cannot be read.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// waitFDs polls pid's open descriptors until they are at most limit or
// within has passed, and returns the last count and whether it got there.
func waitFDs(ctx context.Context, pid, limit int, within time.Duration) (int, bool) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		u, err := ReadUsage(pid)
		if err != nil {
			return 0, false
		}
		if u.FDs <= limit {
			return u.FDs, true
		}
		select {
		case <-ctx.Done():
			return u.FDs, false
		case <-tick.C:
		}
	}
}

// fdsNeeded estimates the open files the router needs at cfg's largest
// level: a client connection and a decode connection per held stream and
// per probe client, and its pools.
func fdsNeeded(cfg Config) int {
	return 2*(maxOf(cfg.HeldStreams)+cfg.ProbeClients) + routerPoolFDs
}

// RaiseFDLimit raises this process's soft limit on open files to its hard
// limit and returns the limit. The processes started afterwards (Start)
// inherit it: Go raises its own soft limit at start-up but starts children
// with the original one unless the limit was set explicitly, as here
// (syscall.Setrlimit). Nothing raises the hard limit: that takes
// CAP_SYS_RESOURCE.
func RaiseFDLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("read the open files limit: %w", err)
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("raise the open files limit to %d: %w", l.Max, err)
	}
	return l.Cur, nil
}
