package router

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/kvindex"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// Snapshots is the router's source of routing state: the latest immutable
// registry snapshot. *replica.Mirror satisfies it. Snapshot must not block.
type Snapshots interface {
	Snapshot() *replica.Snapshot
}

// PeerReporter is how the router tells the registry what it learned from
// engines' answers. registry.Store satisfies it: the store applies one rule
// (registry.ApplyTransferFailure) to the reports of every router replica and
// every prefill-side transfer worker, marking the decode stale, or
// quarantining the pair on a repeat right after the decode re-registered.
type PeerReporter interface {
	ReportTransferFailure(ctx context.Context, f registry.TransferFailure) (registry.Peer, registry.TransferOutcome, error)
}

// Router is the OpenAI-compatible PD router. Build it with New, mount it with
// Mount (or serve Routes), and Close it at shutdown.
type Router struct {
	cfg      Config
	snaps    Snapshots
	reporter PeerReporter
	log      zerolog.Logger
	m        *metrics

	transport http.RoundTripper
	ownedTr   *httpwire.Transport // the transport New built, closed by Close
	// upstreamAuth is the Authorization value engines get, "" for none.
	upstreamAuth string
	apiKeys      [][]byte

	view    atomic.Pointer[view]
	builder viewBuilder
	// kv holds the KV events subscriptions of the precise policy (nil
	// under another), and work its estimate of a queued request's tokens.
	kv    *kvWatch
	work  queuedWork
	pairs pairBreakers
	bufs  sync.Pool // *[]byte relay buffers

	// tracer makes the request, attempt and leg spans; nil when tracing
	// is off (Config.TracerProvider nil), which skips every span.
	tracer trace.Tracer

	reports sync.WaitGroup // reporter calls in flight
	// pairStats are the pairs tried (pair_stats.go); a loop reports
	// those served to an ExchangeReporter until stopExchanges closes.
	pairStats     pairTable
	stopExchanges chan struct{}
	exchangesOnce sync.Once
	exchangeLoop  sync.WaitGroup
	admit         admission        // generation requests in flight, against MaxInflight
	served        atomic.Uint64    // served requests, for LogServedEvery's sampling
	taken         httpwire.Streams // streams on connections taken over from net/http

	watchOnce sync.Once
	watcher   *httpwire.Watcher // their clients' connections; nil until the first HTTP/1.1 stream, or where there is none

	// A view is built by the first request that meets a new snapshot;
	// with a source that announces its snapshots (replica.Mirror), every
	// one gets its view at once too (follow), so that what changed between
	// two snapshots (a quarantine lifted: resetLifted) is seen even when no
	// request came in between.
	stopFollow context.CancelFunc
	following  sync.WaitGroup
}

// closeDetachedWait bounds how long Close waits for the streams it cut to
// end: each ends once its engine's connection is closed, at once.
const closeDetachedWait = 5 * time.Second

// snapshotWatcher is a snapshot source that announces each new snapshot
// (replica.Mirror).
type snapshotWatcher interface {
	Watch(ctx context.Context) <-chan *replica.Snapshot
}

// follow builds the view of every snapshot w announces, until Close.
func (rt *Router) follow(w snapshotWatcher) {
	ctx, cancel := context.WithCancel(context.Background())
	rt.stopFollow = cancel
	snaps := w.Watch(ctx)
	rt.following.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-snaps:
				rt.currentView()
			}
		}
	})
}

// admission counts requests against a cap without queueing: a request over
// it is refused at once, since a queue would only hold the client's
// connection and body while the engines are already saturated.
type admission struct {
	n   atomic.Int64
	max int64
}

func (a *admission) acquire() bool {
	if a.n.Add(1) > a.max {
		a.n.Add(-1)
		return false
	}
	return true
}

func (a *admission) release() { a.n.Add(-1) }

// New builds a Router. reporter may be nil (stale marks and quarantines are
// then only logged); reg may be nil (metrics are then kept in a private
// registry). log is used as given: the caller names the component (serve
// adds component=router), so that the field appears once per line.
func New(cfg Config, snaps Snapshots, reporter PeerReporter, log zerolog.Logger, reg prometheus.Registerer) (*Router, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	if snaps == nil {
		return nil, fmt.Errorf("router: nil Snapshots")
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	rt := &Router{
		cfg:      cfg,
		snaps:    snaps,
		reporter: reporter,
		log:      log,
		m:        m,
	}
	rt.admit.max = int64(cfg.MaxInflight)
	if cfg.TracerProvider != nil {
		rt.tracer = cfg.TracerProvider.Tracer(tracerScope)
	}
	if cfg.UpstreamAPIKey != "" {
		rt.upstreamAuth = "Bearer " + cfg.UpstreamAPIKey
	}
	if cfg.PrefillPolicy == PolicyPrecise {
		index := kvindex.Config{MaxBlocks: cfg.KVIndexMaxBlocks}
		if _, err := kvindex.NewEngine(index); err != nil {
			return nil, fmt.Errorf("router config: KVIndexMaxBlocks: %w", err)
		}
		rt.kv = &kvWatch{log: log, index: index, subs: map[string]*kvSub{}}
		if err := reg.Register(rt.kv); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	rt.transport = cfg.Transport
	if rt.transport == nil {
		rt.ownedTr = httpwire.NewTransport(httpwire.TransportConfig{ConnectTimeout: cfg.ConnectTimeout, MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost})
		rt.transport = rt.ownedTr
	}
	for _, k := range cfg.APIKeys {
		rt.apiKeys = append(rt.apiKeys, []byte(k))
	}
	rt.bufs.New = func() any {
		b := make([]byte, relayBufSize)
		return &b
	}
	count := m.transitionCounter("pair")
	if er, ok := reporter.(ExchangeReporter); ok && cfg.ExchangeReportInterval > 0 {
		rt.stopExchanges = make(chan struct{})
		rt.exchangeLoop.Add(1)
		go func() {
			defer rt.exchangeLoop.Done()
			rt.reportExchanges(er, cfg.ExchangeReportInterval, rt.stopExchanges)
		}()
	}
	rt.pairs.onChange = func(from, to breakerState) {
		switch {
		case from == breakerClosed && to != breakerClosed:
			rt.pairs.notClosed.Add(1)
			m.pairBreakersOpen.Inc()
		case from != breakerClosed && to == breakerClosed:
			rt.pairs.notClosed.Add(-1)
			m.pairBreakersOpen.Dec()
		}
		count(to)
	}
	if w, ok := snaps.(snapshotWatcher); ok {
		rt.follow(w)
	}
	if rt.kv != nil {
		rt.currentView() // the KV events subscriptions start now, not at the first request
	}
	return rt, nil
}

// Mount registers the router's routes on r: POST /v1/chat/completions,
// /v1/completions and /generate, GET /v1/models and SGLang's
// /server_info and /model_info (behind the API keys when set) and GET
// /health. It adds no middleware that would buffer or time out
// a stream.
func (rt *Router) Mount(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(rt.requireAPIKey)
		r.Post(routeChat.path(), rt.serveGeneration(routeChat))
		r.Post(routeCompletions.path(), rt.serveGeneration(routeCompletions))
		r.Post(routeGenerate.path(), rt.serveGeneration(routeGenerate))
		r.Get("/v1/models", rt.serveModels)
		for _, prefix := range []string{"/", "/get_"} {
			r.Get(prefix+"server_info", rt.serveServerInfo)
			r.Get(prefix+"model_info", rt.serveModelInfo)
		}
	})
	r.Get("/health", rt.serveHealth)
}

// LoggedRoutes are the paths whose requests the router logs itself, one
// "request" line each with its outcome, pair and duration: an access log in
// front of the router should not log them again.
func (rt *Router) LoggedRoutes() []string {
	out := make([]string, 0, numRoutes)
	for r := range numRoutes {
		out = append(out, r.path())
	}
	return out
}

// Routes returns a handler serving only the router's routes, for a
// standalone server or tests.
func (rt *Router) Routes() http.Handler {
	r := chi.NewRouter()
	rt.Mount(r)
	return r
}

// Close cuts the streams still running on taken-over connections and
// waits for them (up to closeDetachedWait), waits for pending reports to
// the registry (bounded by Config.ReportTimeout each) and closes idle
// upstream connections.
func (rt *Router) Close() {
	rt.CloseDetached()
	ctx, cancel := context.WithTimeout(context.Background(), closeDetachedWait)
	rt.WaitDetached(ctx)
	cancel()
	if rt.stopFollow != nil {
		rt.stopFollow()
		rt.following.Wait()
	}
	if rt.kv != nil {
		rt.kv.close()
	}
	rt.watchOnce.Do(func() {}) // no watcher starts after this
	if rt.watcher != nil {
		rt.watcher.Stop()
	}
	rt.reports.Wait()
	if rt.stopExchanges != nil {
		rt.exchangesOnce.Do(func() { close(rt.stopExchanges) }) // the loop reports once more
		rt.exchangeLoop.Wait()
	}
	if rt.ownedTr != nil {
		rt.ownedTr.CloseIdleConnections()
	}
}

// requireAPIKey refuses requests without one of Config.APIKeys as a bearer
// token, in OpenAI's error format.
func (rt *Router) requireAPIKey(next http.Handler) http.Handler {
	if len(rt.apiKeys) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !rt.validKey(r.Header.Get("Authorization")) {
			if i := routeOf(r.URL.Path); i >= 0 {
				// A generation request: counted and logged here, as
				// dispatch does for the others.
				rt.m.countRequest(route(i), outcomeUnauthorized)
				rt.log.Info().Str(logRequestID, requestID(w, r)).Str(logRoute, route(i).label()).
					Int(logStatus, http.StatusUnauthorized).Str(logOutcome, outcomeUnauthorized).Msg("request")
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="pdplane"`)
			(&apiError{Status: http.StatusUnauthorized, Message: "missing or invalid API key; send it as 'Authorization: Bearer <key>'",
				Type: "invalid_request_error", Code: codeInvalidAPIKey}).write(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (rt *Router) validKey(h string) bool {
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return false
	}
	tok = strings.TrimSpace(tok)
	match := 0
	for _, k := range rt.apiKeys {
		match |= subtle.ConstantTimeCompare([]byte(tok), k)
	}
	return match == 1
}

func routeOf(path string) int {
	for r := range numRoutes {
		if r.path() == path {
			return int(r)
		}
	}
	return -1
}

// modelList is OpenAI's list-models answer.
type modelList struct {
	Object string      `json:"object"`
	Data   []modelInfo `json:"data"`
}

type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// serveModels lists the models that have ready peers.
func (rt *Router) serveModels(w http.ResponseWriter, _ *http.Request) {
	s := rt.snaps.Snapshot()
	out := modelList{Object: "list", Data: []modelInfo{}}
	for _, name := range s.Models() {
		created := int64(0)
		if mr := s.Routes(name); mr != nil {
			for _, ps := range [][]*registry.Peer{mr.Prefills, mr.Decodes} {
				for _, p := range ps {
					if c := p.CreatedAt.Unix(); !p.CreatedAt.IsZero() && (created == 0 || c < created) {
						created = c
					}
				}
			}
		}
		out.Data = append(out.Data, modelInfo{ID: name, Object: "model", Created: created, OwnedBy: "pdplane"})
	}
	writeJSON(w, http.StatusOK, out)
}

// serveHealth answers 200 while at least one pair is routable, so that
// another router can use pdplane as an upstream worker, and 503 with the
// reason otherwise.
func (rt *Router) serveHealth(w http.ResponseWriter, _ *http.Request) {
	ok, reason := rt.snaps.Snapshot().Routable()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
