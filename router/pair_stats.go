package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/prometheus/client_golang/prometheus"
)

// ExchangeReporter takes the pairs this router served. A PeerReporter that
// implements it (the store, in serve) gets them every
// Config.ExchangeReportInterval, so that the registry keeps which pairs
// exchanged KV last, across replicas.
type ExchangeReporter interface {
	RecordExchanges(ctx context.Context, xs []registry.Exchange) error
}

// pairStats is what the router keeps of one pair it tried: the pair's
// series (its attempts, the KV blocks it moved) and when it last served a
// request, which the reports send to an ExchangeReporter. An attempt looks
// it up once.
type pairStats struct {
	ok, failed, kvBlocks prometheus.Counter
	at, reported         atomic.Int64 // Unix ns: the latest served request, the latest reported
}

// pairTable holds the pairStats of every pair tried, by (prefill ID,
// decode ID), until either peer leaves.
type pairTable struct {
	m sync.Map // pairKey -> *pairStats
}

// of returns the stats of pr, resolving its series on its first attempt.
func (t *pairTable) of(m *metrics, pr *pair) *pairStats {
	k := pairKey{pr.p.peer.ID, pr.d.peer.ID}
	if ps, ok := t.m.Load(k); ok {
		return ps.(*pairStats)
	}
	p, d := pr.p.peer.Name, pr.d.peer.Name
	ps, _ := t.m.LoadOrStore(k, &pairStats{
		ok:       m.pairAttempts.WithLabelValues(p, d, "ok"),
		failed:   m.pairAttempts.WithLabelValues(p, d, "failed"),
		kvBlocks: m.pairKVBlocks.WithLabelValues(p, d),
	})
	return ps.(*pairStats)
}

// report sends the pairs served since their last report, in batches of
// registry.MaxExchangesPerReport; a batch the reporter refused is sent
// again with the next report.
func (t *pairTable) report(ctx context.Context, to ExchangeReporter) error {
	var batch []registry.Exchange
	var sent []*pairStats
	var ats []int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := to.RecordExchanges(ctx, batch); err != nil {
			return err
		}
		for i, ps := range sent {
			ps.reported.Store(ats[i])
		}
		batch, sent, ats = batch[:0], sent[:0], ats[:0]
		return nil
	}
	var err error
	t.m.Range(func(k, v any) bool {
		ps := v.(*pairStats)
		at := ps.at.Load()
		if at <= ps.reported.Load() {
			return true
		}
		pk := k.(pairKey)
		batch = append(batch, registry.Exchange{PrefillID: pk.prefill, DecodeID: pk.decode, At: time.Unix(0, at).UTC()})
		sent, ats = append(sent, ps), append(ats, at)
		if len(batch) == registry.MaxExchangesPerReport {
			err = flush()
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// forget drops the pairs of peers no longer in live (metrics.forgetPeer
// deletes their series).
func (t *pairTable) forget(live map[string]*peerState) {
	t.m.Range(func(k, _ any) bool {
		pk := k.(pairKey)
		if _, ok := live[pk.prefill]; !ok {
			t.m.Delete(k)
		} else if _, ok := live[pk.decode]; !ok {
			t.m.Delete(k)
		}
		return true
	})
}

// reportExchanges sends the served pairs to er every interval until stop
// closes, and once more then.
func (rt *Router) reportExchanges(er ExchangeReporter, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false // a store outage is logged once, not every interval
	for {
		select {
		case <-stop:
			rt.sendExchanges(er, &failing)
			return
		case <-t.C:
			rt.sendExchanges(er, &failing)
		}
	}
}

func (rt *Router) sendExchanges(er ExchangeReporter, failing *bool) {
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.ReportTimeout)
	defer cancel()
	err := rt.pairStats.report(ctx, er)
	switch {
	case err != nil && !*failing:
		rt.log.Warn().Err(err).Msg("report the pairs served; they are sent again with each report until one goes through")
	case err == nil && *failing:
		rt.log.Info().Msg("the pairs served are reported again")
	}
	*failing = err != nil
}
