package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// ExchangeReporter takes the pairs this router served. A PeerReporter that
// implements it (the store, in serve) gets them every
// Config.ExchangeReportInterval, so that the registry keeps which pairs
// exchanged KV last, across replicas.
type ExchangeReporter interface {
	RecordExchanges(ctx context.Context, xs []registry.Exchange) error
}

// exchanges are the pairs this router served: for each (prefill ID, decode
// ID), when it last served a request and what of that it reported. A
// served request costs a map lookup and an atomic store; the reports read
// the map in the background.
type exchanges struct {
	m sync.Map // pairKey -> *exchangeAt
}

type exchangeAt struct{ at, reported atomic.Int64 } // Unix ns

// served records that the pair served a request at now.
func (x *exchanges) served(prefill, decode string, now time.Time) {
	k := pairKey{prefill, decode}
	e, ok := x.m.Load(k)
	if !ok {
		e, _ = x.m.LoadOrStore(k, &exchangeAt{})
	}
	e.(*exchangeAt).at.Store(now.UnixNano())
}

// report sends the pairs served since their last report, in batches of
// registry.MaxExchangesPerReport; a batch the reporter refused is sent
// again with the next report.
func (x *exchanges) report(ctx context.Context, to ExchangeReporter) error {
	var batch []registry.Exchange
	var sent []*exchangeAt
	var ats []int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := to.RecordExchanges(ctx, batch); err != nil {
			return err
		}
		for i, e := range sent {
			e.reported.Store(ats[i])
		}
		batch, sent, ats = batch[:0], sent[:0], ats[:0]
		return nil
	}
	var err error
	x.m.Range(func(k, v any) bool {
		e := v.(*exchangeAt)
		at := e.at.Load()
		if at <= e.reported.Load() {
			return true
		}
		pk := k.(pairKey)
		batch = append(batch, registry.Exchange{PrefillID: pk.prefill, DecodeID: pk.decode, At: time.Unix(0, at).UTC()})
		sent, ats = append(sent, e), append(ats, at)
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

// forget drops the pairs of peers no longer in live.
func (x *exchanges) forget(live map[string]*peerState) {
	x.m.Range(func(k, _ any) bool {
		pk := k.(pairKey)
		if _, ok := live[pk.prefill]; !ok {
			x.m.Delete(k)
		} else if _, ok := live[pk.decode]; !ok {
			x.m.Delete(k)
		}
		return true
	})
}

// reportExchanges sends the served pairs to er every interval until stop
// closes, and once more then.
func (rt *Router) reportExchanges(er ExchangeReporter, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			rt.sendExchanges(er)
			return
		case <-t.C:
			rt.sendExchanges(er)
		}
	}
}

func (rt *Router) sendExchanges(er ExchangeReporter) {
	ctx, cancel := context.WithTimeout(context.Background(), rt.cfg.ReportTimeout)
	defer cancel()
	if err := rt.exchanged.report(ctx, er); err != nil {
		rt.log.Warn().Err(err).Msg("report the pairs served; they are sent again with the next report")
	}
}
