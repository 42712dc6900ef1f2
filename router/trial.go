package router

import (
	"context"
	"time"

	"github.com/pdplane/pdplane/registry/replica"
	"go.opentelemetry.io/otel/trace"
)

// A quarantine that expired puts its pair on trial (registry/quarantine.go):
// the snapshot routes the pair again, and its next transfer decides. This
// router lets one request at a time test a pair on trial (its pair breaker
// goes half-open when the trial first shows up in a snapshot) and reports a
// success to the registry, which ends the quarantine; a failure with the
// missing-memory-kind error goes to the registry as any other, which
// quarantines the pair again at once.

// TrialReporter is the optional part of a PeerReporter that ends a
// quarantine on trial; registry.Store satisfies it.
type TrialReporter interface {
	ReportTransferSuccess(ctx context.Context, prefillID, decodeID, reporter string) (bool, error)
}

// halfOpen lets exactly one probe through the breaker next.
func (b *breaker) halfOpen() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.setLocked(breakerHalfOpen)
}

// armTrials half-opens the pair breaker of every pair newly on trial in s
// (one probe request at a time on this replica);
// the caller holds the view builder's lock.
func (rt *Router) armTrials(s *replica.Snapshot, b *viewBuilder) {
	trials := s.Trials()
	if len(trials) == 0 && len(b.trials) == 0 {
		return
	}
	next := make(map[pairKey]time.Time, len(trials))
	for _, q := range trials {
		// A quarantine renewed since the last view built (views are built
		// on demand, so that one may never have been seen) starts at
		// another time: a new trial.
		k := pairKey{q.PrefillID, q.DecodeID}
		next[k] = q.At
		if at, seen := b.trials[k]; !seen || !at.Equal(q.At) {
			rt.pairs.getOrCreate(q.PrefillID, q.DecodeID).halfOpen()
		}
	}
	b.trials = next
}

// onTrialSuccess reports a successful attempt on a pair on trial.
func (rt *Router) onTrialSuccess(pr *pair) {
	p, d := pr.p.peer, pr.d.peer
	if !rt.snaps.Snapshot().OnTrial(p.ID, d.ID) {
		return
	}
	tr, ok := rt.reporter.(TrialReporter)
	if !ok {
		return
	}
	log := rt.log.With().Str(logPrefill, p.Name).Str(logDecode, d.Name).Logger()
	rt.report(func(ctx context.Context) error {
		lifted, err := tr.ReportTransferSuccess(ctx, p.ID, d.ID, "router:"+rt.cfg.Replica)
		if err == nil && lifted {
			log.Info().Msg("pair on trial transferred; the registry lifted its quarantine")
		}
		return err
	}, log, trace.SpanContext{}, "report transfer success on trial")
}
