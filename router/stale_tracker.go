package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// Stale-mark causes, the values of the cause label.
const causeMissingMemKind = "missing_mem_kind"

// staleTracker remembers, per pair, the decode generation of its first
// memory-kind failure, so that a second one after the decode re-registered
// quarantines the pair instead of marking the decode stale again (which
// would loop), and it deduplicates stale marks of one generation.
type staleTracker struct {
	mu          sync.Mutex
	firsts      map[pairKey]memKindFailure
	marked      map[string]int64 // decode ID -> generation already reported stale
	quarantined map[pairKey]int64
}

type memKindFailure struct {
	decodeGen int64
	at        time.Time
}

func (t *staleTracker) init() {
	t.firsts = map[pairKey]memKindFailure{}
	t.marked = map[string]int64{}
	t.quarantined = map[pairKey]int64{}
}

// maxTracked bounds the tracker's maps; older entries are swept beyond it.
const maxTracked = 4096

// memKindVerdict is what to do about one memory-kind failure.
type memKindVerdict struct {
	markStale  bool
	quarantine bool
}

// observe records a memory-kind failure of the pair at the decode's current
// generation.
func (t *staleTracker) observe(k pairKey, decodeGen int64, now time.Time, window time.Duration) memKindVerdict {
	t.mu.Lock()
	defer t.mu.Unlock()
	var v memKindVerdict
	first, seen := t.firsts[k]
	if seen && now.Sub(first.at) > window {
		seen = false
	}
	switch {
	case seen && first.decodeGen < decodeGen:
		// It failed the same way again right after the decode re-registered:
		// deterministic, so quarantine rather than loop through stale marks.
		if g, done := t.quarantined[k]; !done || g < decodeGen {
			t.quarantined[k] = decodeGen
			v.quarantine = true
		}
	case !seen:
		t.firsts[k] = memKindFailure{decodeGen: decodeGen, at: now}
	}
	if !v.quarantine {
		if g, done := t.marked[k.decode]; !done || g < decodeGen {
			t.marked[k.decode] = decodeGen
			v.markStale = true
		}
	}
	if len(t.firsts) > maxTracked {
		for pk, f := range t.firsts {
			if now.Sub(f.at) > window {
				delete(t.firsts, pk)
			}
		}
	}
	if len(t.marked) > maxTracked {
		clear(t.marked)
	}
	if len(t.quarantined) > maxTracked {
		clear(t.quarantined)
	}
	return v
}

// onMemKindFailure handles a prefill answer that says the decode's memory
// kind is missing: the decode is skipped by this router at once, and the
// registry is told (stale mark, or quarantine of the pair on a repeat) in the
// background so that the retry does not wait for it.
func (rt *Router) onMemKindFailure(pr *pair, errText string, rid string) {
	d, p := pr.d, pr.p
	now := rt.cfg.Now()
	v := rt.stale.observe(pairKey{p.peer.ID, d.peer.ID}, d.peer.Generation, now, rt.cfg.QuarantineWindow)
	log := rt.log.With().Str(logRequestID, rid).Str(logPrefill, p.peer.Name).Str(logDecode, d.peer.Name).
		Int64(logGeneration, d.peer.Generation).Logger()
	report := registry.TransferFailure{
		DecodeID: d.peer.ID, PrefillID: p.peer.ID, Error: errText,
		Reason:   "prefill " + p.peer.Name + " could not send KV to this decode: " + pdproto.MissingMemKindMessage,
		Reporter: "router:" + rt.cfg.Replica,
	}
	if len(d.peer.Ranks) > 0 {
		// Names the generation that failed, so that a late report cannot
		// mark a freshly re-registered decode stale.
		report.DecodeAgent = d.peer.Ranks[0].AgentName
	}
	pairOut := func() {
		// Keep this pair out of this router's picks until the snapshot
		// carries the quarantine the registry decided on.
		rt.pairs.getOrCreate(p.peer.ID, d.peer.ID).forceOpen(rt.cfg.Now())
		rt.m.quarantines.Inc()
	}
	if v.quarantine {
		pairOut()
		log.Warn().Str(logDetail, registry.GeometryDiff(&p.peer.PeerSpec, &d.peer.PeerSpec)).
			Msg("pair failed with missing KV memory kind again after the decode re-registered; reporting it for quarantine")
		rt.reportFailure(report, log, nil)
		return
	}
	// Skip this decode generation here at once; the snapshot follows.
	prevSkip := d.state.staleGen.Load()
	setMax(&d.state.staleGen, d.peer.Generation+1)
	if !v.markStale {
		return
	}
	rt.m.staleMarks.WithLabelValues(causeMissingMemKind).Inc()
	log.Warn().Msg("decode's KV memory kind is missing on the prefill side; reporting it stale")
	rt.reportFailure(report, log, func(out registry.TransferOutcome) {
		if out != registry.OutcomeQuarantined {
			return
		}
		// This router's tracker guessed "first failure", but the registry
		// holds an earlier one (seen by another replica or reporter) and
		// quarantined the pair. The decode is not stale and will not
		// re-register, so stop skipping it; only the pair leaves routing.
		d.state.staleGen.CompareAndSwap(d.peer.Generation+1, prevSkip)
		pairOut()
	})
}

// reportFailure sends f to the registry in the background; then, when set,
// runs with the registry's outcome, which overrides this router's guess.
func (rt *Router) reportFailure(f registry.TransferFailure, log zerolog.Logger, then func(registry.TransferOutcome)) {
	rt.report(func(ctx context.Context) error {
		_, out, err := rt.reporter.ReportTransferFailure(ctx, f)
		if err != nil {
			return err
		}
		log.Info().Str("outcome", string(out)).Msg("registry applied the transfer failure")
		if then != nil {
			then(out)
		}
		return nil
	}, log, "report transfer failure")
}

// report runs one reporter call in the background, bounded by
// ReportTimeout, detached from the request that triggered it.
func (rt *Router) report(call func(ctx context.Context) error, log zerolog.Logger, what string) {
	if rt.reporter == nil {
		return
	}
	rt.reports.Add(1)
	go func() {
		defer rt.reports.Done()
		ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.ReportTimeout)
		defer cancel()
		if err := call(ctx); err != nil {
			log.Error().Err(err).Msg(what)
		}
	}()
}

// setMax raises a to v unless it is already at least v.
func setMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if cur >= v || a.CompareAndSwap(cur, v) {
			return
		}
	}
}
