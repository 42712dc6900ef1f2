// Package server is pdplane's control-plane HTTP surface: it implements the
// generated REST API (server/api) over a registry.Store, serves /healthz,
// /readyz and /metrics, and mounts the router's OpenAI routes and the status
// page on the same chi router. It owns no routing logic and no SQL.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/rs/zerolog/hlog"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server/api"
)

// Config configures a Server.
type Config struct {
	// AdminToken guards operator actions and is accepted everywhere.
	AdminToken string
	// JoinTokens admit new peers; several are accepted at once so that a
	// rotation never locks agents out. With no admin token and no join
	// token the control plane is open (see auth.go).
	JoinTokens []string
	// StaleReportRate and StaleReportBurst bound the stale reports each
	// peer may make about other peers (per second, and at once).
	StaleReportRate  float64
	StaleReportBurst int
	// StaleVictimRate and StaleVictimBurst bound the accepted reports
	// about one peer from all reporters together (per second, and at
	// once), so that the prefills of a fleet cannot spend a decode's heal
	// budget faster than it heals. Twice the per-reporter limits by
	// default.
	StaleVictimRate  float64
	StaleVictimBurst int
	// Now is the clock of the report limiter; time.Now when nil.
	Now func() time.Time
	// MaxBodyBytes caps request bodies on /api/v1 below each operation's
	// own limit (x-pdplane-max-body in openapi.yaml; see limits.go), for an
	// operator or a test that wants less. By default it is the largest
	// operation's limit, so the spec alone decides.
	MaxBodyBytes int64
	// HeartbeatInterval and LeaseTTL are what agents are told at
	// registration; LeaseTTL must match the store's.
	HeartbeatInterval time.Duration
	LeaseTTL          time.Duration
	// BodyTimeout bounds how long a client may take to send a request
	// body (see httpwire.BodyDeadline); 30 s by default.
	BodyTimeout time.Duration
	// MaxEventStreams caps concurrent GET /api/v1/events/stream; 256 by
	// default. Over it, a stream is refused with 503 and Retry-After.
	MaxEventStreams int
	// AllowedHosts, when set, are the only Host headers served (host, any
	// port; or host:port), against DNS rebinding. Others get 421.
	AllowedHosts []string
	// Loopback says that the server listens on loopback addresses only.
	// Without tokens it then serves only loopback Host names (localhost,
	// 127.0.0.1, [::1], any loopback IP) and AllowedHosts (checkHost).
	Loopback bool
	// PeerNetworks decides which addresses a registration's url and
	// bootstrap_host may name; the zero value refuses link-local,
	// metadata-service and unspecified addresses.
	PeerNetworks PeerNetworkPolicy
	// Version is pdplane_build_info's version label: the binary's own
	// version (main.version, linked in with -X). Empty: read from the build
	// information (a non-trimpath build's -X main.version, else the module
	// version), else "dev".
	Version string
	// Replica names this replica on the status page (serve --replica);
	// the host name when empty.
	Replica string
	// StoreKind is the registry store behind Deps.Store, "memory" or
	// "postgres", for the status page's header.
	StoreKind string
}

// WithDefaults fills in unset fields.
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 64 << 20 // above every operation's limit
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = registry.DefaultHeartbeatInterval
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = registry.DefaultLeaseTTL
	}
	if c.StaleReportRate == 0 {
		c.StaleReportRate = 2
	}
	if c.StaleReportBurst == 0 {
		c.StaleReportBurst = 20
	}
	if c.StaleVictimRate == 0 {
		c.StaleVictimRate = 2 * c.StaleReportRate
	}
	if c.StaleVictimBurst == 0 {
		c.StaleVictimBurst = 2 * c.StaleReportBurst
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = 30 * time.Second
	}
	if c.MaxEventStreams == 0 {
		c.MaxEventStreams = 256
	}
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
	if c.StoreKind == "" {
		c.StoreKind = "memory"
	}
	if c.Version == "" {
		c.Version, _ = runningVersion("")
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxBodyBytes < 1<<20:
		return fmt.Errorf("max body bytes must be at least 1 MiB, got %d", c.MaxBodyBytes)
	case c.HeartbeatInterval <= 0:
		return errors.New("heartbeat interval must be positive")
	case c.LeaseTTL <= c.HeartbeatInterval:
		return fmt.Errorf("lease ttl %s must be longer than the heartbeat interval %s", c.LeaseTTL, c.HeartbeatInterval)
	case c.StaleReportRate < 0 || c.StaleReportBurst < 1:
		return fmt.Errorf("stale report rate must be positive and burst at least 1, got %g/s burst %d", c.StaleReportRate, c.StaleReportBurst)
	case c.StaleVictimRate < 0 || c.StaleVictimBurst < 1:
		return fmt.Errorf("stale victim rate must be positive and burst at least 1, got %g/s burst %d", c.StaleVictimRate, c.StaleVictimBurst)
	case c.BodyTimeout < 0:
		return fmt.Errorf("body timeout must not be negative, got %s", c.BodyTimeout)
	case c.MaxEventStreams < 1:
		return fmt.Errorf("max event streams must be at least 1, got %d", c.MaxEventStreams)
	case c.StoreKind != "memory" && c.StoreKind != "postgres":
		return fmt.Errorf("store kind must be memory or postgres, got %q", c.StoreKind)
	}
	for _, h := range c.AllowedHosts {
		if h == "" || strings.ContainsAny(h, "/ ") {
			return fmt.Errorf("allowed hosts: %q is not host or host:port", h)
		}
	}
	for i, t := range c.JoinTokens {
		switch {
		case strings.TrimSpace(t) == "":
			return fmt.Errorf("join token %d is empty", i+1)
		case t == c.AdminToken:
			return fmt.Errorf("join token %d equals the admin token; they must differ", i+1)
		}
	}
	return nil
}

// Snapshots gives the current routing snapshot; *replica.Mirror is one.
type Snapshots interface {
	Snapshot() *replica.Snapshot
}

// Mounter adds routes to the server's chi router; the router package's
// OpenAI routes come in this way.
type Mounter interface {
	Mount(r chi.Router)
}

// selfLogger is a Mounter that logs some of its routes' requests itself
// (the router's generation routes, with their outcome and pair): the
// access log counts those but does not log them again.
type selfLogger interface {
	LoggedRoutes() []string
}

// Breakers is what the replica's router observes of peers and pairs: its
// circuit breakers. It is the router's own state, never the registry's;
// *router.Router is one. A state is "closed", "open" or "half_open", since
// when it last opened (zero while closed); ok is false when the router
// tracks none.
type Breakers interface {
	PeerBreaker(peerID string) (state string, since time.Time, ok bool)
	PairBreaker(prefillID, decodeID string) (state string, since time.Time, ok bool)
	OpenBreakers() (peers, pairs int)
	// InFlight is the requests the router has in flight with the peer,
	// as prefill or decode.
	InFlight(peerID string) int64
}

// Deps are the server's collaborators.
type Deps struct {
	Store    registry.Store
	Snaps    Snapshots
	Registry *prometheus.Registry
	// Routes, if set, mounts the OpenAI-compatible routes.
	Routes Mounter
	// Breakers, if set, adds the router's breakers to peers, pairs and the
	// fleet summary.
	Breakers Breakers
	// Web, if set, serves the status page at /.
	Web http.Handler
}

// Server is the control-plane HTTP server.
type Server struct {
	cfg      Config
	store    registry.Store
	snaps    Snapshots
	breakers Breakers // nil without a router
	log      zerolog.Logger
	metrics  *serverMetrics
	streams  streamSlots
	mux      *chi.Mux
	handler  http.Handler
	reports  *reportLimiter
	// victims bounds the accepted reports about each peer.
	victims *reportLimiter
	// access is who may call each /api/v1 operation, read from the
	// x-pdplane-access declarations of the embedded openapi.yaml.
	access map[string]access
	// maxBody is the largest body each /api/v1 operation takes, from its
	// x-pdplane-max-body (limits.go).
	maxBody map[string]int64
	// shuttingDown is closed by BeginShutdown (shutdown.go).
	shuttingDown chan struct{}
	shutdownOnce sync.Once
	// selfLogged are the route patterns whose handler logs each request.
	selfLogged map[string]bool
	// exchanges are the pairs' last exchanges, for the pairs API.
	exchanges exchangeCache
}

// New builds the server and its routes.
func New(cfg Config, deps Deps, log zerolog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Store == nil || deps.Snaps == nil || deps.Registry == nil {
		return nil, errors.New("server needs a store, a snapshot source and a metrics registry")
	}
	access, err := loadRouteAccess()
	if err != nil {
		return nil, err
	}
	maxBody, err := loadRouteMaxBody()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, store: deps.Store, exchanges: exchangeCache{store: deps.Store}, snaps: deps.Snaps, breakers: deps.Breakers, log: log, access: access, maxBody: maxBody,
		reports:      newReportLimiter(cfg.StaleReportRate, cfg.StaleReportBurst, cfg.Now),
		victims:      newReportLimiter(cfg.StaleVictimRate, cfg.StaleVictimBurst, cfg.Now),
		shuttingDown: make(chan struct{})}
	s.metrics = newServerMetrics(deps.Registry, deps.Snaps, cfg.Version)

	r := chi.NewRouter()
	s.mux = r
	r.Use(requestID, s.accessLog,
		s.checkHost, s.refuseTrace, httpwire.BodyDeadline(cfg.BodyTimeout), s.guardCrossSite, s.guardWrites)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Get("/readyz", s.readyz)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(deps.Registry, promhttp.HandlerOpts{}))

	strict := api.NewStrictHandlerWithOptions(handlers{s}, nil, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  s.requestError,
		ResponseErrorHandlerFunc: s.responseError,
	})
	r.Group(func(r chi.Router) {
		r.Use(s.limitBody)
		api.HandlerWithOptions(strict, api.ChiServerOptions{
			BaseRouter: r,
			// The last is outermost: the token is checked before anything
			// else, and the body is read only for a caller that may send it.
			Middlewares:      []api.MiddlewareFunc{s.oneJSONValue, s.limitEventStreams, s.authMiddleware},
			ErrorHandlerFunc: s.requestError,
		})
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		if isAPI(r) {
			writeProblem(w, &Problem{Type: ProblemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no such endpoint: " + r.URL.Path})
			return
		}
		http.NotFound(w, r)
	})
	r.MethodNotAllowed(s.methodNotAllowed)
	if deps.Routes != nil {
		deps.Routes.Mount(r)
		if sl, ok := deps.Routes.(selfLogger); ok {
			s.selfLogged = map[string]bool{}
			for _, p := range sl.LoggedRoutes() {
				s.selfLogged[p] = true
			}
		}
	}
	if deps.Web != nil {
		// Only the paths the status page serves, and only GET and HEAD, so
		// that an unknown path or method reaches NotFound and
		// MethodNotAllowed above instead of the page's own plain 404.
		for _, m := range []string{http.MethodGet, http.MethodHead} {
			r.Method(m, "/", deps.Web)
			r.Method(m, "/assets/*", deps.Web)
		}
	}
	s.handler = r
	return s, nil
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// requestError turns decoding and parameter errors into problem+json that
// names the field.
func (s *Server) requestError(w http.ResponseWriter, r *http.Request, err error) {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tooLarge *http.MaxBytesError
	var param *api.InvalidParamFormatError
	var required *api.RequiredParamError
	switch {
	case errors.As(err, &tooLarge):
		writeProblem(w, s.toProblem(r, err))
	case errors.Is(err, os.ErrDeadlineExceeded):
		writeProblem(w, &Problem{Type: ProblemMalformed, Title: "Request timeout", Status: http.StatusRequestTimeout,
			Detail: "the request body did not arrive in time", Field: "body"})
	case errors.As(err, &syntax):
		writeProblem(w, malformed("body", fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, syntax)))
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		writeProblem(w, malformed(field, fmt.Sprintf("%s: expected %s, got JSON %s", field, typ.Type, typ.Value)))
	case errors.As(err, &param):
		writeProblem(w, malformed(param.ParamName, fmt.Sprintf("invalid %s: %v", param.ParamName, param.Err)))
	case errors.As(err, &required):
		writeProblem(w, malformed(required.ParamName, required.ParamName+" is required"))
	case errors.Is(err, io.ErrUnexpectedEOF):
		writeProblem(w, malformed("body", "malformed JSON: the body ends in the middle of a value"))
	case errors.Is(err, io.EOF):
		writeProblem(w, malformed("body", "a JSON body is required"))
	default:
		writeProblem(w, malformed("body", "malformed request: "+err.Error()))
	}
}

// responseError writes a handler's error as problem+json. A client that left
// (the usual end of an event stream) is not an error: there is nobody to
// answer, so it is logged at debug level and nothing is written.
func (s *Server) responseError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		s.requestLog(r).Debug().Err(err).Msg("client gone (499)")
		return
	}
	writeProblem(w, s.toProblem(r, err))
}

// readyz is 200 when the routing snapshot holds at least one compatible
// pair of ready peers: that is what this replica needs to serve clients.
// From BeginShutdown on it is 503, so that load balancers stop sending
// while the requests in flight finish.
// A store that does not answer does not make it unready: the router keeps
// routing from its last snapshot, and taking every replica out of a load
// balancer because their shared database is away would stop the traffic
// that still flows. The body says so; agents learn of the outage from the
// 503s of the API and fail over.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.ShuttingDown() {
		http.Error(w, "not ready: shutting down", http.StatusServiceUnavailable)
		return
	}
	if ok, reason := s.snaps.Snapshot().Routable(); !ok {
		http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.requestLog(r).Warn().Err(err).Msg("readiness: store does not answer; routing from the last snapshot")
		_, _ = w.Write([]byte("ready (registry store does not answer: routing from the last snapshot)\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// requestID gives each request its one ID: the client's X-Request-Id when
// it is valid (pdproto.ValidRequestID: short, printable ASCII), else a new
// one. The ID goes into the request's context, where the router takes it
// for both upstream legs and its own logs and requestLog for the server's,
// and once into the answer's X-Request-Id.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := pdproto.AcceptRequestID(r.Header.Get(pdproto.RequestIDHeader))
		w.Header().Set(pdproto.RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(pdproto.ContextWithRequestID(r.Context(), id)))
	})
}

// requestLog is r's logger: the server's, with the request's ID. It is made
// when there is something to log rather than for every request: most
// requests log nothing here (the router logs its generation requests
// itself, with their ID).
func (s *Server) requestLog(r *http.Request) *zerolog.Logger {
	id, _ := pdproto.RequestIDFromContext(r.Context())
	l := s.log.With().Str("request_id", id).Logger()
	return &l
}

// accessLog logs each request once it is done and counts it by route. A
// request that reached a route whose handler logs it (the router's
// generation routes) is counted but not logged twice; one refused before
// routing (route "unmatched") is logged here.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return hlog.AccessHandler(func(r *http.Request, status, size int, d time.Duration) {
		route := ""
		if rc := chi.RouteContext(r.Context()); rc != nil {
			route = rc.RoutePattern() // joined from its parts at each call
		}
		if route == "" {
			route = "unmatched"
		}
		s.metrics.requestsBy.inc(route, status)
		if s.selfLogged[route] {
			return
		}
		level := zerolog.DebugLevel
		if status >= 500 && route != "/readyz" { // not ready is an answer, not a failure
			level = zerolog.WarnLevel
		}
		// The request's ID as requestLog adds it, without a logger made
		// for a line the level drops (every heartbeat's, by default).
		id, _ := pdproto.RequestIDFromContext(r.Context())
		s.log.WithLevel(level).Str("request_id", id).Str("method", r.Method).Str("route", route).Int("status", status).Int("size", size).
			Float64("duration_ms", float64(d.Microseconds())/1e3).Msg("request")
	})(next)
}

// statusLabels are the status codes 100 to 599 as metric label values,
// made once rather than per request.
var statusLabels = func() (l [600]string) {
	for c := 100; c < len(l); c++ {
		l[c] = strconv.Itoa(c)
	}
	return l
}()

func statusLabel(code int) string {
	if code >= 100 && code < len(statusLabels) {
		return statusLabels[code]
	}
	return strconv.Itoa(code)
}
