package registry

import (
	"context"
	"fmt"
	"time"
)

// An Exchange says that a pair's decode was served KV by its prefill: a
// request routed through the pair succeeded. Each router replica records
// the pairs it served and sends the latest time of each in a batch every
// second; the store keeps, per pair, the latest time any replica reported.
// After a peer restarts, they tell which partners it touched last (the
// status page shows them beside the pair's preflight, which the restart
// makes run again: Preflight.Current); an agent whose decode recomputes
// KV names the pair when there was one partner only.
type Exchange struct {
	PrefillID string
	DecodeID  string
	At        time.Time
}

// MaxExchangesPerReport bounds one report: a replica serving more pairs
// than that within a report's interval sends several.
const MaxExchangesPerReport = 10000

// ExchangeStore keeps the pairs' latest exchanges.
type ExchangeStore interface {
	// RecordExchanges keeps, per pair, the later of its recorded time and
	// the reported one. Pairs of which a peer is gone are left out.
	RecordExchanges(ctx context.Context, xs []Exchange) error
	// Exchanges lists the latest exchange of every pair whose peers both
	// exist.
	Exchanges(ctx context.Context) ([]Exchange, error)
}

// ValidateExchanges checks a report, naming the first bad entry.
func ValidateExchanges(xs []Exchange) error {
	if len(xs) > MaxExchangesPerReport {
		return fieldErr("exchanges", "at most %d entries, got %d", MaxExchangesPerReport, len(xs))
	}
	for i, x := range xs {
		switch {
		case !IsPeerID(x.PrefillID):
			return fieldErr(fmt.Sprintf("exchanges[%d].prefill_id", i), "not a peer id")
		case !IsPeerID(x.DecodeID):
			return fieldErr(fmt.Sprintf("exchanges[%d].decode_id", i), "not a peer id")
		case x.At.IsZero():
			return fieldErr(fmt.Sprintf("exchanges[%d].at", i), "required")
		}
	}
	return nil
}
