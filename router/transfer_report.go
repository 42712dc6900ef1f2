package router

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// Stale-mark causes, the values of the cause label.
const (
	causeMissingMemKind = "missing_mem_kind"
	causeKVLoad         = "kv_load"
)

// onMemKindFailure handles a prefill answer that says the decode's memory
// kind is missing, and reports it in the background. The router keeps
// only what it saw: the pair failed (its breaker, settle; the request's
// retry avoids the pair, not the decode). What the failure means is the
// registry's to decide (registry.ApplyTransferFailure): a quarantine of
// the pair while the decode's heal plan holds (other prefills keep the
// decode), a stale mark of the decode, nothing (a duplicate, or a report
// about an agent that is gone), or, on a repeat right after the decode
// re-registered, a quarantine for good; it reaches this router, as every
// replica, through the snapshot.
//
// sc, when valid, is the span of the attempt that failed: the report's own
// span (the registry's, when it traces its writes) joins its trace.
func (rt *Router) onMemKindFailure(pr *pair, errText string, rid string, sc trace.SpanContext) {
	d, p := pr.d, pr.p
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
	log.Warn().Msg("decode's KV memory kind is missing on the prefill side; the pair is out of this request, and the registry decides the rest")
	rt.reportFailure(report, log, sc, func(out registry.TransferOutcome) {
		switch out {
		case registry.OutcomeStale:
			rt.m.staleMarks.WithLabelValues(causeMissingMemKind).Inc()
		case registry.OutcomeHealPending:
			rt.m.quarantines.Inc()
			log.Warn().Msg("registry quarantined the pair and holds the decode's heal plan; other prefills keep using the decode")
		case registry.OutcomeQuarantined:
			rt.m.quarantines.Inc()
			log.Warn().Str(logDetail, registry.GeometryDiff(&p.peer.PeerSpec, &d.peer.PeerSpec)).
				Msg("registry quarantined the pair: it failed with missing KV memory kind again after the decode re-registered")
		}
	})
}

// onKVLoadFailure handles a vLLM decode that answered 5xx after a good
// prefill: under kv_load_failure_policy=fail (vLLM 0.32's default) that is
// a KV load from this prefill that failed, and its only remedy on a stock
// engine is the decode's restart, which drops the NIXL handshakes it
// cached (a prefill restarted under the same engine_id leaves the decode
// reading from the old agent: NIXL_ERR_REMOTE_DISCONNECT on every
// request, until the decode restarts). The registry's rule decides, as for
// SGLang's memory-kind error: a first failure quarantines the pair and
// holds the decode's heal plan while other prefills can use it, or starts
// the heal at once when none can; a repeat right after the heal
// quarantines the pair.
func (rt *Router) onKVLoadFailure(pr *pair, errText string, rid string, sc trace.SpanContext) {
	d, p := pr.d, pr.p
	log := rt.log.With().Str(logRequestID, rid).Str(logPrefill, p.peer.Name).Str(logDecode, d.peer.Name).
		Int64(logGeneration, d.peer.Generation).Logger()
	report := registry.TransferFailure{
		DecodeID: d.peer.ID, PrefillID: p.peer.ID, Error: errText,
		Reason:   "decode could not load the KV of prefill " + p.peer.Name + " (vLLM answered 5xx after a good prefill)",
		Reporter: "router:" + rt.cfg.Replica,
	}
	if len(d.peer.Ranks) > 0 {
		report.DecodeAgent = d.peer.Ranks[0].AgentName
	}
	log.Warn().Msg("decode failed to load the prefill's KV; reporting the pair to the registry")
	rt.reportFailure(report, log, sc, func(out registry.TransferOutcome) {
		switch out {
		case registry.OutcomeStale:
			rt.m.staleMarks.WithLabelValues(causeKVLoad).Inc()
		case registry.OutcomeHealPending, registry.OutcomeQuarantined:
			rt.m.quarantines.Inc()
		}
	})
}

// reportFailure sends f to the registry in the background; then, when set,
// runs with the registry's outcome (for metrics and the log: the outcome
// itself reaches routing through the snapshot).
func (rt *Router) reportFailure(f registry.TransferFailure, log zerolog.Logger, sc trace.SpanContext, then func(registry.TransferOutcome)) {
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
	}, log, sc, "report transfer failure")
}

// report runs one reporter call in the background, bounded by
// ReportTimeout, detached from the request that triggered it. A call the
// store could not answer in time (unavailable, or past the timeout: a
// store starved for a moment) is made once more after reportRetryPause:
// a lost transfer-failure report is a heal that never starts. Reports are
// idempotent: the registry answers a repeat as it did the first.
func (rt *Router) report(call func(ctx context.Context) error, log zerolog.Logger, sc trace.SpanContext, what string) {
	if rt.reporter == nil {
		return
	}
	rt.reports.Add(1)
	go func() {
		defer rt.reports.Done()
		parent := context.Background()
		if sc.IsValid() {
			parent = trace.ContextWithSpanContext(parent, sc)
		}
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(parent, rt.cfg.ReportTimeout)
			err := call(ctx)
			cancel()
			switch {
			case err == nil:
				return
			case attempt == 1 && (errors.Is(err, registry.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)):
				log.Warn().Err(err).Msg(what + "; trying once more")
				time.Sleep(reportRetryPause)
			default:
				log.Error().Err(err).Msg(what)
				return
			}
		}
	}()
}

// reportRetryPause is how long a report the store could not answer waits
// before its second try.
const reportRetryPause = time.Second
