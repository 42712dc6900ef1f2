package tracing

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdplane/pdplane/registry"
)

// scope names the tracer of the spans this package makes.
const scope = "github.com/pdplane/pdplane/tracing"

// Span attribute keys of registry writes.
const (
	attrPeerID     = attribute.Key("pdplane.peer.id")
	attrPeerName   = attribute.Key("pdplane.peer.name")
	attrPrefillID  = attribute.Key("pdplane.prefill.id")
	attrState      = attribute.Key("pdplane.peer.state")
	attrPrevState  = attribute.Key("pdplane.peer.previous_state")
	attrAction     = attribute.Key("pdplane.heartbeat.action")
	attrReason     = attribute.Key("pdplane.reason")
	attrOutcome    = attribute.Key("pdplane.outcome")
	attrGeneration = attribute.Key("pdplane.peer.generation")
	attrCreated    = attribute.Key("pdplane.peer.created")
	attrChanged    = attribute.Key("pdplane.changed")
	attrReporter   = attribute.Key("pdplane.reporter")
)

// Store is a registry.Store whose writes are spans: one per registration,
// removal, drain, stale mark, transfer failure or success report and
// quarantine lift, each a child of the span in its context (the control
// plane's request, or the router's attempt for its own reports).
//
// Heartbeats and sweeps are frequent and mostly change nothing, so a span
// is kept only for those that do something: a heartbeat whose answer
// orders a heal step (re-register, heal) or moves the peer to another state
// than the one this Store last answered, or that reports a failed heal; a
// sweep that changed peers. Each such span is named after the step, so that
// a heal reads as a sequence of spans (stale, heal, draining, ready).
type Store struct {
	registry.Store
	tracer trace.Tracer
	now    func() time.Time
	states sync.Map // peer id → registry.State this Store last answered a heartbeat with
}

// NewStore wraps s so that its writes are spans of tp's; with tp nil
// (tracing off) it returns s itself.
func NewStore(s registry.Store, tp trace.TracerProvider) registry.Store {
	if tp == nil {
		return s
	}
	return &Store{Store: s, tracer: tp.Tracer(scope), now: time.Now}
}

// start opens a span of a registry write.
func (s *Store) start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// end closes span, recording err.
func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Register is Store.Register in a span.
func (s *Store) Register(ctx context.Context, spec registry.PeerSpec, claim registry.Claim) (registry.RegisterResult, error) {
	ctx, span := s.start(ctx, "registry.register", attrPeerName.String(spec.Name))
	res, err := s.Store.Register(ctx, spec, claim)
	if err == nil {
		span.SetAttributes(attrPeerID.String(res.Peer.ID), attrCreated.Bool(res.Created),
			attrGeneration.Int64(res.Peer.Generation), attrState.String(string(res.Peer.State)))
	}
	end(span, err)
	return res, err
}

// Delete is Store.Delete in a span.
func (s *Store) Delete(ctx context.Context, id string) error {
	ctx, span := s.start(ctx, "registry.delete", attrPeerID.String(id))
	err := s.Store.Delete(ctx, id)
	if err == nil {
		s.states.Delete(id)
	}
	end(span, err)
	return err
}

// Drain is Store.Drain in a span.
func (s *Store) Drain(ctx context.Context, id string) (registry.Peer, error) {
	ctx, span := s.start(ctx, "registry.drain", attrPeerID.String(id))
	p, err := s.Store.Drain(ctx, id)
	end(span, err)
	return p, err
}

// MarkStale is Store.MarkStale in a span.
func (s *Store) MarkStale(ctx context.Context, id, reason, errText string) (registry.Peer, error) {
	ctx, span := s.start(ctx, "registry.mark_stale", attrPeerID.String(id), attrReason.String(reason))
	p, err := s.Store.MarkStale(ctx, id, reason, errText)
	end(span, err)
	return p, err
}

// ReportTransferFailure is Store.ReportTransferFailure in a span, with the
// registry's verdict (stale, quarantined, ...) as an attribute.
func (s *Store) ReportTransferFailure(ctx context.Context, f registry.TransferFailure) (registry.Peer, registry.TransferOutcome, error) {
	ctx, span := s.start(ctx, "registry.report_transfer_failure", attrPeerID.String(f.DecodeID),
		attrPrefillID.String(f.PrefillID), attrReporter.String(f.Reporter), attrReason.String(f.Reason))
	p, out, err := s.Store.ReportTransferFailure(ctx, f)
	if err == nil {
		span.SetAttributes(attrOutcome.String(string(out)))
	}
	end(span, err)
	return p, out, err
}

// LiftQuarantine is Store.LiftQuarantine in a span.
func (s *Store) LiftQuarantine(ctx context.Context, prefillID, decodeID, by string) error {
	ctx, span := s.start(ctx, "registry.lift_quarantine", attrPrefillID.String(prefillID), attrPeerID.String(decodeID),
		attrReporter.String(by))
	err := s.Store.LiftQuarantine(ctx, prefillID, decodeID, by)
	end(span, err)
	return err
}

// ReportTransferSuccess is Store.ReportTransferSuccess in a span.
func (s *Store) ReportTransferSuccess(ctx context.Context, prefillID, decodeID, reporter string) (bool, error) {
	ctx, span := s.start(ctx, "registry.report_transfer_success", attrPrefillID.String(prefillID),
		attrPeerID.String(decodeID), attrReporter.String(reporter))
	ended, err := s.Store.ReportTransferSuccess(ctx, prefillID, decodeID, reporter)
	span.SetAttributes(attrChanged.Bool(ended))
	end(span, err)
	return ended, err
}

// Heartbeat is Store.Heartbeat, in a span only when it is a heal step or
// a change of state (see Store).
func (s *Store) Heartbeat(ctx context.Context, hb registry.Heartbeat) (registry.HeartbeatReply, error) {
	start := s.now()
	reply, err := s.Store.Heartbeat(ctx, hb)
	var prev registry.State
	if err == nil {
		if old, loaded := s.states.Swap(hb.PeerID, reply.State); loaded {
			prev = old.(registry.State)
		}
	}
	step := err != nil || hb.HealError != "" || (reply.Action != "" && reply.Action != registry.ActionNone) ||
		(prev != "" && prev != reply.State)
	if !step {
		return reply, err
	}
	name := "registry.heartbeat"
	switch {
	case err != nil:
	case reply.Action != "" && reply.Action != registry.ActionNone:
		name = "registry.heal_step." + string(reply.Action)
	default:
		name = "registry.heal_step." + string(reply.State)
	}
	_, span := s.tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(
		attrPeerID.String(hb.PeerID), attrAction.String(string(reply.Action)), attrState.String(string(reply.State)),
		attrPrevState.String(string(prev)), attrReason.String(reply.Reason)))
	if hb.HealError != "" {
		span.AddEvent("heal failed", trace.WithAttributes(attrReason.String(hb.HealError)))
	}
	end(span, err)
	return reply, err
}

// ExpireLeases is Store.ExpireLeases, in a span when it expired any.
func (s *Store) ExpireLeases(ctx context.Context, now time.Time) (int, error) {
	return s.sweep(ctx, "registry.expire_leases", func() (int, error) { return s.Store.ExpireLeases(ctx, now) })
}

// GrantLeaseGrace is Store.GrantLeaseGrace, in a span when it extended any.
func (s *Store) GrantLeaseGrace(ctx context.Context, now time.Time) (int, error) {
	return s.sweep(ctx, "registry.grant_lease_grace", func() (int, error) { return s.Store.GrantLeaseGrace(ctx, now) })
}

// ExpireQuarantines is Store.ExpireQuarantines, in a span when it changed
// any.
func (s *Store) ExpireQuarantines(ctx context.Context, now time.Time) (int, error) {
	return s.sweep(ctx, "registry.expire_quarantines", func() (int, error) { return s.Store.ExpireQuarantines(ctx, now) })
}

// sweep runs a periodic write and keeps its span only when it changed
// something or failed.
func (s *Store) sweep(ctx context.Context, name string, call func() (int, error)) (int, error) {
	start := s.now()
	n, err := call()
	if n == 0 && err == nil {
		return n, err
	}
	_, span := s.tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attribute.Int("pdplane.peers_changed", n)))
	end(span, err)
	return n, err
}
