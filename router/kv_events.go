package router

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/kvevents"
	"github.com/pdplane/pdplane/kvindex"
	"github.com/pdplane/pdplane/registry"
)

// Every router replica subscribes to the KV events of every prefill that
// publishes them, and keeps its own index of the blocks each holds: the
// events go from the engines to the replicas that pick, as llm-d's EPP
// does, and none passes through the store, whose writes would otherwise
// grow with the fleet's traffic. A replica that starts late asks each
// engine's replay socket for what it still holds.
//
// An engine's index is used only while its subscription is live: from a
// (re)subscription until its connection fails; meanwhile the engine counts
// as holding nothing, and a model none of whose prefills is live is routed
// by the ring. On a resubscription the replay socket brings back what was
// missed. A gap
// the replay socket cannot fill, a malformed batch or a batch the index
// refuses empties the index, which refills from the engine's next events.
// A new generation of the peer (a restart) is a new subscription with a new
// index; a peer that leaves takes its subscription with it.

// kvSub is one engine's subscription and index.
type kvSub struct {
	name   string
	cfg    kvevents.Config
	gen    int64
	index  *kvindex.Engine
	live   atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}

	// capacity is the engine's cache in blocks as the index learnt it: the
	// most blocks the index held, once the engine evicted any (it removes
	// blocks only when full); 0 before. peak and evicting are run's.
	capacity atomic.Int64
	peak     int64
	evicting bool
	// sent counts, by key, the blocks of the prompts this router sent the
	// engine whose prefill legs have not ended (precise.go).
	sentMu sync.Mutex
	sent   map[uint64]int32

	refusing              bool // the last batch was refused (run's goroutine only)
	batches, gaps, resets atomic.Uint64
	lag                   atomic.Uint64 // seconds between the engine's last batch and its arrival, as float64 bits
}

// lagSeconds is how late the engine's last batch arrived, by the two clocks.
func (s *kvSub) lagSeconds() float64 { return math.Float64frombits(s.lag.Load()) }

// kvWatch keeps the subscriptions of one router, by peer ID.
type kvWatch struct {
	log     zerolog.Logger
	index   kvindex.Config
	mu      sync.Mutex
	subs    map[string]*kvSub
	stopped bool
}

// kvRetry is the pause before a failed subscription is made again.
const kvRetry = time.Second

// sync makes the subscriptions those of the prefills among peers that
// publish KV events, at their current generation, and points each peer's
// state at its subscription (nil: none). It runs while a view is built.
func (w *kvWatch) sync(peers []*registry.Peer, states map[string]*peerState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	keep := make(map[string]bool, len(w.subs))
	for _, p := range peers {
		st := states[p.ID]
		if !p.Role.Prefills() || p.KVEvents.Endpoint == "" || st == nil {
			if st != nil {
				st.kv.Store(nil)
			}
			continue
		}
		cfg := kvevents.Config{Endpoint: strings.TrimPrefix(p.KVEvents.Endpoint, "tcp://"),
			ReplayEndpoint: strings.TrimPrefix(p.KVEvents.ReplayEndpoint, "tcp://"), Topic: p.KVEvents.Topic}
		s := w.subs[p.ID]
		if s != nil && (s.gen != p.Generation || s.cfg != cfg) {
			s.stop()
			s = nil
		}
		if s == nil {
			s = w.start(p.Name, p.Generation, cfg)
			w.subs[p.ID] = s
		}
		st.kv.Store(s)
		keep[p.ID] = true
	}
	for id, s := range w.subs {
		if !keep[id] {
			s.stop()
			delete(w.subs, id)
		}
	}
}

// start subscribes to one engine's events until stop.
func (w *kvWatch) start(name string, gen int64, cfg kvevents.Config) *kvSub {
	ctx, cancel := context.WithCancel(context.Background())
	index, _ := kvindex.NewEngine(w.index) // validated by New
	s := &kvSub{name: name, cfg: cfg, gen: gen, index: index, cancel: cancel, done: make(chan struct{})}
	log := w.log.With().Str("peer", name).Int64("generation", gen).Str("kv_events", cfg.Endpoint).Logger()
	go s.run(ctx, log)
	return s
}

func (s *kvSub) stop() {
	s.cancel()
	s.live.Store(false)
}

// run keeps the subscription up: on a failed connection it subscribes
// again from where it was, after kvRetry.
func (s *kvSub) run(ctx context.Context, log zerolog.Logger) {
	defer close(s.done)
	var next uint64
	failing := false
	for ctx.Err() == nil {
		s.live.Store(true)
		applied := s.batches.Load()
		n, err := kvevents.Stream(ctx, s.cfg, next, func(m kvevents.Message) { s.apply(m, log) })
		next = n
		s.live.Store(false)
		if s.batches.Load() != applied {
			failing = false // it worked for a while: a new failure is news
		}
		if err == nil {
			return
		}
		malformed := errors.Is(err, kvevents.ErrMalformed)
		if malformed {
			s.reset()
		}
		switch {
		case failing: // said when the subscription started failing
		case malformed:
			log.Warn().Err(err).Msg("KV events: a malformed batch; the engine's index is emptied and refills from its next events")
		default:
			log.Warn().Err(err).Msg("KV events: subscription lost; routing ignores the engine's index until it is back")
		}
		failing = true
		select {
		case <-ctx.Done():
		case <-time.After(kvRetry):
		}
	}
}

// apply adds one batch to the index.
func (s *kvSub) apply(m kvevents.Message, log zerolog.Logger) {
	if m.Missed > 0 {
		s.gaps.Add(1)
		s.reset()
		log.Warn().Uint64("missed_batches", m.Missed).Msg("KV events: batches lost for good; the engine's index is emptied and refills")
	}
	if err := s.index.Apply(m.Batch); err != nil {
		s.reset()
		if !s.refusing { // said once until a batch is taken again
			log.Warn().Err(err).Uint64("seq", m.Seq).Msg("KV events: a batch the index refuses; the engine's index is emptied")
		}
		s.refusing = true
		return
	}
	s.refusing = false
	s.batches.Add(1)
	s.learnCapacity(m.Batch)
	if m.Batch.TS > 0 {
		lag := float64(time.Now().UnixNano())/1e9 - m.Batch.TS
		s.lag.Store(math.Float64bits(lag))
	}
}

// learnCapacity follows the index's size after a batch: the engine's
// cache holds about as many blocks as the index did at most, once the
// engine removed one from its GPU (an offload tier's removals say nothing
// of the GPU's room). vLLM removes a cached block's hash only when the
// block is taken for another (v1/core/block_pool.py
// _maybe_evict_cached_block, BlockRemoved with medium "GPU").
func (s *kvSub) learnCapacity(b kvevents.Batch) {
	s.peak = max(s.peak, int64(s.index.Len()))
	if !s.evicting {
		for i := range b.Events {
			if ev := &b.Events[i]; ev.Kind == kvevents.BlockRemoved && (ev.Medium == "" || ev.Medium == "GPU") {
				s.evicting = true
				break
			}
		}
	}
	if s.evicting {
		s.capacity.Store(s.peak)
	}
}

func (s *kvSub) reset() {
	s.resets.Add(1)
	s.index.Reset()
}

// close ends every subscription and waits for them.
func (w *kvWatch) close() {
	w.mu.Lock()
	w.stopped = true
	subs := w.subs
	w.subs = nil
	w.mu.Unlock()
	for _, s := range subs {
		s.stop()
		<-s.done
	}
}

// kvDescs describe the series of each engine's subscription, by peer name.
var kvDescs = struct{ blocks, batches, gaps, resets, lag, live *prometheus.Desc }{
	blocks: prometheus.NewDesc("pdplane_router_kv_index_blocks",
		"KV blocks the precise policy's index holds for the engine, from its KV events.", []string{"peer"}, nil),
	batches: prometheus.NewDesc("pdplane_router_kv_events_batches_total",
		"KV event batches applied to the engine's index (this subscription: a new generation starts over).", []string{"peer"}, nil),
	gaps: prometheus.NewDesc("pdplane_router_kv_events_gaps_total",
		"Gaps in the engine's KV event sequence that its replay socket could not fill: each emptied its index.", []string{"peer"}, nil),
	resets: prometheus.NewDesc("pdplane_router_kv_index_resets_total",
		"Times the engine's index was emptied: gaps, malformed batches, batches the index refused.", []string{"peer"}, nil),
	lag: prometheus.NewDesc("pdplane_router_kv_events_lag_seconds",
		"How late the engine's last KV event batch arrived, its timestamp against this replica's clock.", []string{"peer"}, nil),
	live: prometheus.NewDesc("pdplane_router_kv_events_live",
		"1 while the engine's subscription is up and its index is used; 0 while it is not (the engine counts as holding nothing).", []string{"peer"}, nil),
}

// Describe and Collect make the subscriptions a prometheus.Collector.
func (w *kvWatch) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{kvDescs.blocks, kvDescs.batches, kvDescs.gaps, kvDescs.resets, kvDescs.lag, kvDescs.live} {
		ch <- d
	}
}

func (w *kvWatch) Collect(ch chan<- prometheus.Metric) {
	w.mu.Lock()
	subs := make([]*kvSub, 0, len(w.subs))
	for _, s := range w.subs {
		subs = append(subs, s)
	}
	w.mu.Unlock()
	for _, s := range subs {
		live := 0.0
		if s.live.Load() {
			live = 1
		}
		ch <- prometheus.MustNewConstMetric(kvDescs.blocks, prometheus.GaugeValue, float64(s.index.Len()), s.name)
		ch <- prometheus.MustNewConstMetric(kvDescs.batches, prometheus.CounterValue, float64(s.batches.Load()), s.name)
		ch <- prometheus.MustNewConstMetric(kvDescs.gaps, prometheus.CounterValue, float64(s.gaps.Load()), s.name)
		ch <- prometheus.MustNewConstMetric(kvDescs.resets, prometheus.CounterValue, float64(s.resets.Load()), s.name)
		ch <- prometheus.MustNewConstMetric(kvDescs.lag, prometheus.GaugeValue, s.lagSeconds(), s.name)
		ch <- prometheus.MustNewConstMetric(kvDescs.live, prometheus.GaugeValue, live, s.name)
	}
}
