package registry

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// The quarantine rule. A pair that failed deterministically (see
// ApplyTransferFailure) is quarantined: kept out of routing while both peers
// stay routable with everyone else. A quarantine ends in one of three ways:
//
//   - an operator lifts it (LiftQuarantine): it is gone at once;
//   - either peer re-registers with a different geometry, or is removed;
//   - its time runs out (the stores' quarantine TTL; zero keeps it until
//     lifted): it goes on trial (ExpireQuarantine). A pair on trial is
//     routable again, and its next transfer decides: a failure quarantines
//     it again at once, for another TTL (ApplyPairTransferFailure); a
//     success ends the quarantine (ApplyTrialSuccess).
//
// These functions are the rule, written once; both stores apply them under
// their lock or in one transaction, append the events to the decode's log,
// and announce the change to every replica as for any other change.

// DefaultQuarantineTTL is how long a quarantine keeps a pair out of routing
// before the pair is re-tested, when serve is not told otherwise.
const DefaultQuarantineTTL = 30 * time.Minute

// Quarantine event kinds, beside EventQuarantined.
const (
	// EventQuarantineLifted: the quarantine is gone, lifted by an operator
	// or ended by a successful probe request on trial.
	EventQuarantineLifted EventKind = "quarantine_lifted"
	// EventQuarantineTrial: the quarantine expired; the pair is routable
	// again and its next transfer decides.
	EventQuarantineTrial EventKind = "quarantine_trial"
)

// ErrNotQuarantined: the pair exists but is not quarantined. It is an
// ErrNotFound.
var ErrNotQuarantined = fmt.Errorf("the pair is not quarantined: %w", ErrNotFound)

// QuarantineControl is how quarantines end; every Store implements it.
type QuarantineControl interface {
	// LiftQuarantine removes the quarantine of the pair (active or on
	// trial) on an operator's word; by names the operator for the event.
	// ErrNotFound when either peer is unknown, ErrNotQuarantined when the
	// pair is not quarantined.
	LiftQuarantine(ctx context.Context, prefillID, decodeID, by string) error
	// ExpireQuarantines puts every quarantine whose time ran out before
	// now on trial and returns how many it changed.
	ExpireQuarantines(ctx context.Context, now time.Time) (int, error)
	// ReportTransferSuccess tells the registry a transfer of the pair
	// succeeded: a quarantine on trial ends (true); anything else is left
	// as it is (false).
	ReportTransferSuccess(ctx context.Context, prefillID, decodeID, reporter string) (bool, error)
}

// Active reports whether the quarantine keeps its pair out of routing: it
// is not on trial.
func (q *Quarantine) Active() bool { return !q.Trial }

// QuarantineExpiry is when a quarantine made at now expires; nil (never)
// when ttl is not positive.
func QuarantineExpiry(now time.Time, ttl time.Duration) *time.Time {
	if ttl <= 0 {
		return nil
	}
	t := now.Add(ttl)
	return &t
}

// ExpireQuarantine puts an active quarantine whose time has come on trial.
// changed is false when nothing happens.
func ExpireQuarantine(q Quarantine, now time.Time) (next Quarantine, events []Event, changed bool) {
	if q.Trial || q.ExpiresAt == nil || now.Before(*q.ExpiresAt) {
		return q, nil, false
	}
	next = q
	next.Trial = true
	return next, []Event{{Kind: EventQuarantineTrial,
		Message: fmt.Sprintf("quarantine of the pair with prefill %s expired; the pair is routable on trial: its next transfer lifts the quarantine or renews it", q.PrefillID)}}, true
}

// ApplyPairTransferFailure is ApplyTransferFailure for a pair that may be
// quarantined (cur, nil when not). A failure of a pair on trial about the
// decode's current agent quarantines it again at once, with a fresh expiry;
// otherwise ApplyTransferFailure decides (others as there), and a
// quarantine it makes expires after ttl. A quarantine returned carries its
// detail.
func ApplyPairTransferFailure(decode Peer, prefill *Peer, f TransferFailure, last *PairFailure, cur *Quarantine, now time.Time, window, ttl time.Duration, heal HealConfig, others int) (next Peer, events []Event, q *Quarantine, rec *PairFailure, out TransferOutcome) {
	if cur != nil && cur.Trial && f.PrefillID == cur.PrefillID && (f.DecodeAgent == "" || decode.HasAgent(f.DecodeAgent)) {
		errText := f.Error
		if errText == "" {
			errText = "transfer failed"
		}
		nq := Quarantine{PrefillID: cur.PrefillID, DecodeID: decode.ID, At: now, ExpiresAt: QuarantineExpiry(now, ttl)}
		nq.Detail = fmt.Sprintf("failed again on trial after its quarantine expired: %s", errText)
		if prefill != nil {
			nq.Detail += "; geometry: " + GeometryDiff(&prefill.PeerSpec, &decode.PeerSpec)
		}
		return decode, nil, &nq, nil, OutcomeQuarantined
	}
	next, events, q, rec, out = ApplyTransferFailure(decode, f, last, now, window, heal, others)
	if q != nil {
		q.ExpiresAt = QuarantineExpiry(now, ttl)
		if prefill != nil && out == OutcomeQuarantined {
			q.Detail = QuarantineDetail(prefill, &decode, f.Error)
		}
	}
	return next, events, q, rec, out
}

// ApplyTrialSuccess ends a quarantine on trial after a successful transfer.
// lifted is false (and nothing happens) when the pair is not on trial: an
// active quarantine ends only by expiry or an operator.
func ApplyTrialSuccess(cur *Quarantine, reporter string) (events []Event, lifted bool) {
	if cur == nil || !cur.Trial {
		return nil, false
	}
	msg := fmt.Sprintf("quarantine of the pair with prefill %s lifted: a transfer on trial succeeded", cur.PrefillID)
	if reporter != "" {
		msg += " (reported by " + reporter + ")"
	}
	return []Event{{Kind: EventQuarantineLifted, Message: msg}}, true
}

// LiftQuarantine is an operator lifting the quarantine cur (nil when the
// pair is not quarantined: ErrNotFound). by names who lifted it.
func LiftQuarantine(cur *Quarantine, prefillID, decodeID, by string) ([]Event, error) {
	if cur == nil {
		return nil, fmt.Errorf("pair %s → %s: %w", prefillID, decodeID, ErrNotQuarantined)
	}
	if by == "" {
		by = "an operator"
	}
	state := "quarantine"
	if cur.Trial {
		state = "quarantine (on trial)"
	}
	return []Event{{Kind: EventQuarantineLifted,
		Message: fmt.Sprintf("%s of the pair with prefill %s lifted by %s", state, prefillID, by)}}, nil
}

// QuarantineSweeper puts expired quarantines on trial. Every replica runs
// one; the stores make the change once, whichever replica gets there first.
type QuarantineSweeper struct {
	Store    Store
	Interval time.Duration // default one second
	Now      func() time.Time
	Log      zerolog.Logger
}

// Run sweeps every interval until ctx ends.
func (s *QuarantineSweeper) Run(ctx context.Context) {
	iv, now := s.Interval, s.Now
	if iv <= 0 {
		iv = time.Second
	}
	if now == nil {
		now = time.Now
	}
	everyTick(ctx, iv, func(ctx context.Context) {
		n, err := s.Store.ExpireQuarantines(ctx, now())
		switch {
		case err != nil && ctx.Err() == nil:
			s.Log.Warn().Err(err).Msg("expire quarantines")
		case n > 0:
			s.Log.Info().Int("pairs", n).Msg("quarantines expired; the pairs are routable on trial")
		}
	})
}
