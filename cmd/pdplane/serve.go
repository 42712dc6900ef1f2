package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"

	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/tracing"
	"github.com/pdplane/pdplane/web"
)

type serveConfig struct {
	addr        string
	databaseURL string
	adminToken  string
	joinTokens  string
	peerToken   string // deprecated alias of joinTokens
	insecure    bool
	front       bool
	takeover    bool
	receipt     bool
	replica     string
	logLevel    string
	leaseTTL    time.Duration
	// quarantineTTL: how long a quarantined pair stays out of routing
	// before one probe re-tests it; 0 keeps it until lifted.
	quarantineTTL time.Duration
	heartbeat     time.Duration

	apiKeys       string
	prefillPolicy string
	decodePolicy  string

	decodeFirstByteTimeout time.Duration
	prefillTimeout         time.Duration
	allowedHosts           string
	allowPeerNetworks      string
	bodyTimeout            time.Duration
	maxInflight            int
	maxEventStreams        int
	// shutdownGrace is how long the requests in flight at SIGTERM may
	// take to finish before they are cut.
	shutdownGrace time.Duration
	// otlpEndpoint is the OTLP/HTTP collector traces go to; empty leaves
	// it to the OTEL_EXPORTER_OTLP_* variables (tracing off without them).
	otlpEndpoint string
	// pprofAddr, when set, serves runtime profiles on that loopback
	// address (see startPprof).
	pprofAddr string
	// logServedEvery is --access-log as router.Config.LogServedEvery.
	logServedEvery int

	heal registry.HealConfig
}

// controlPlane is a running `pdplane serve`: store, mirror, sweeper, API,
// router and status page on one listener.
type controlPlane struct {
	BaseURL string
	log     zerolog.Logger
	hs      *http.Server
	ln      *httpwire.Listener // hs's: takes back connections the router took over
	srv     *server.Server
	store   registry.Store
	mirror  *replica.Mirror
	router  *router.Router
	tracing *tracing.Provider
	pprof   *http.Server // nil without --pprof-addr
	errc    chan error
	grace   time.Duration

	// inflight counts the requests in the HTTP handler, so that shutdown
	// knows when they are done and how many it cut; slow streams the
	// router took off net/http's connections (router.Detached) are counted
	// by the router.
	inflight httpwire.InFlight
	// bgCancel stops the background pieces (mirror, sweepers), which run
	// on their own context: at a signal they go on serving the requests
	// in flight and stop only after the HTTP server; bg waits for the
	// sweepers.
	bgCancel  context.CancelFunc
	bg        sync.WaitGroup
	closeOnce sync.Once
}

func (c *serveConfig) flags(fs *cli.FlagSet) {
	fs.Str(&c.addr, "addr", "127.0.0.1:8080", "listen address HOST:PORT")
	fs.Str(&c.databaseURL, "database-url", "", "PostgreSQL URL; empty uses the embedded in-memory store")
	fs.Str(&c.adminToken, "admin-token", "", "bearer token for operator actions (delete, drain, stale marks)")
	fs.List(&c.joinTokens, "join-token", "", "comma-separated bearer tokens that admit new peers (several during a rotation); "+
		"each registration returns the peer's own credential")
	fs.Str(&c.peerToken, "peer-token", "", "deprecated: the same as --join-token")
	fs.Bool(&c.front, "front", true, "read and answer generation requests (POST of HTTP/1.1 to /v1/chat/completions, /v1/completions, "+
		"/generate) with pdplane's own HTTP/1.1 code, which costs less CPU than net/http's server; every other request, and every one "+
		"it does not take, goes to net/http (false: net/http serves all; Linux only)")
	fs.Bool(&c.receipt, "route-receipt", false, "add X-Pdplane-Route to every routed answer: the pair that served it with both generations, and the attempts that failed before it")
	fs.Bool(&c.takeover, "takeover", true, "take a slow stream's connection over from net/http, so that a held stream costs "+
		"~19 KiB instead of ~45 (false: every stream stays on net/http's connection; Linux only)")
	fs.Bool(&c.insecure, "insecure", false, "serve without tokens on a non-loopback address: anyone who reaches it may register peers and read their KV metadata")
	fs.Str(&c.replica, "replica", "", "name of this replica in the stale reports its router makes (default: the host name)")
	fs.List(&c.apiKeys, "api-keys", "", "comma-separated client API keys required on /v1 and /generate; empty leaves them open")
	fs.Str(&c.prefillPolicy, "prefill-policy", string(router.PolicyCacheAware), "round_robin, random, power_of_two, least_load, cache_aware "+
		"or precise (by the prompt blocks each prefill will hold when the prompt computes, from the KV events its registration names and the prompts sent ahead, weighed against its queue)")
	fs.Str(&c.decodePolicy, "decode-policy", string(router.PolicyPowerOfTwo), "round_robin, random, power_of_two, least_load or cache_aware")
	fs.Dur(&c.decodeFirstByteTimeout, "decode-first-byte-timeout", router.DefaultDecodeFirstByteTimeout,
		"how long a streamed decode may send nothing after its prefill succeeded before the request moves to another pair")
	fs.Dur(&c.prefillTimeout, "prefill-timeout", router.DefaultPrefillTimeout,
		"how long a prefill may take to answer (the whole prompt computed and its KV sent) before the request moves to another pair")
	fs.Str(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.Dur(&c.heartbeat, "heartbeat-interval", registry.DefaultHeartbeatInterval, "how often agents heartbeat")
	fs.Dur(&c.leaseTTL, "lease-ttl", registry.DefaultLeaseTTL, "how long a peer lives without a heartbeat")
	fs.Dur(&c.quarantineTTL, "quarantine-ttl", registry.DefaultQuarantineTTL,
		"how long a quarantined pair stays out of routing before its next transfer re-tests it (0: until an operator lifts it)")
	fs.List(&c.allowPeerNetworks, "allow-peer-networks", "", "comma-separated CIDR prefixes a peer's url or bootstrap_host may name although "+
		"they are link-local, a metadata service or unspecified (refused by default)")
	fs.List(&c.allowedHosts, "allowed-hosts", "", "comma-separated host or host:port names the server answers to (others get 421, against DNS rebinding); "+
		"empty allows any, except without tokens on a loopback --addr, where only localhost, 127.0.0.1 and [::1] are served besides these")
	fs.Dur(&c.bodyTimeout, "body-timeout", 30*time.Second, "how long a client may take to send a request body")
	fs.Int(&c.maxInflight, "max-inflight", 4096, "generation requests served at once; more get 503 with Retry-After")
	fs.Int(&c.maxEventStreams, "max-event-streams", 256, "event streams (/api/v1/events/stream) open at once; more get 503 with Retry-After")
	fs.Dur(&c.heal.Hold, "heal-hold", registry.DefaultHealHold,
		"how long a decode whose pair failed keeps serving its healthy pairs (the failing ones quarantined) before it drains for its heal")
	fs.Dur(&c.heal.DrainGrace, "heal-drain-grace", registry.DefaultHealDrainGrace,
		"how long requests in flight on a stale decode may take to finish before its agent runs the heal action")
	fs.Dur(&c.heal.VerifyTimeout, "heal-verify-timeout", registry.DefaultHealVerifyTimeout,
		"how long a healed engine may take to come back as a new instance before the peer is marked failed")
	fs.Int(&c.heal.MaxPerHour, "heal-max-per-hour", registry.DefaultHealMaxPerHour, "heals per peer per hour; past it the peer is marked failed")
	fs.Dur(&c.shutdownGrace, "shutdown-grace", DefaultShutdownGrace,
		"at SIGTERM or SIGINT, how long the requests in flight (streamed completions among them) may take to finish; "+
			"/readyz is 503 and event streams end at once, and what is left after the grace is cut")
	fs.Str(&c.otlpEndpoint, "otlp-endpoint", "", "OpenTelemetry collector URL (OTLP/HTTP protobuf, e.g. http://otel-collector:4318) for traces of "+
		"routed requests, registry writes and heal steps; empty uses $OTEL_EXPORTER_OTLP_ENDPOINT, and no tracing without it")
	cli.Custom(fs, &c.logServedEvery, "access-log", "errors|all|sample:N", "errors, all or sample:N with N at least 1", "sample:10",
		parseAccessLog, formatAccessLog, "which served generation requests get an info-level \"request\" line: errors (none: only failed and refused requests, "+
			"the default; every request at --log-level debug), all, or sample:N (one served request in N); failures are always logged")
	fs.Str(&c.pprofAddr, "pprof-addr", "", "loopback HOST:PORT to serve Go runtime profiles on (/debug/pprof/: CPU, heap, goroutines), "+
		"on a listener of its own; empty serves none")
}

// DefaultShutdownGrace is --shutdown-grace's default: room for a long
// streamed completion, and within what an orchestrator usually waits
// (Kubernetes' terminationGracePeriodSeconds is 30 s).
const DefaultShutdownGrace = 30 * time.Second

// serveFlags is serve's flag set: dev's (serveConfig.flags), the GC floor
// and a config file.
func serveFlags(c *serveConfig, gcMinHeapMiB *int) *cli.FlagSet {
	fs := cli.NewFlagSet("serve")
	c.flags(fs)
	// serve's alone: dev runs its engines in the same process.
	gcMinHeapFlag(fs, gcMinHeapMiB)
	fs.ConfigFile()
	return fs
}

func runServe(ctx context.Context, args []string) error {
	var c serveConfig
	var gcMinHeapMiB int
	fs := serveFlags(&c, &gcMinHeapMiB)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(c.logLevel, false)
	if err != nil {
		return err
	}
	stopGC, err := startGCFloorMiB(gcMinHeapMiB)
	if err != nil {
		return err
	}
	defer stopGC()
	cp, err := startControlPlane(ctx, c, log)
	if err != nil {
		return err
	}
	return cp.wait(ctx)
}

// tokens returns the join tokens: --join-token's list plus the deprecated
// --peer-token.
func (c *serveConfig) tokens() []string {
	var out []string
	for _, t := range strings.Split(c.joinTokens+","+c.peerToken, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// agentToken is what the simulators `dev` starts register with.
func (c *serveConfig) agentToken() string {
	if ts := c.tokens(); len(ts) > 0 {
		return ts[0]
	}
	return c.adminToken
}

// checkExposure refuses an open control plane on an address other hosts
// can reach: anyone there could join the fleet and take traffic.
func (c *serveConfig) checkExposure() error {
	if c.adminToken != "" || len(c.tokens()) > 0 || c.insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", c.addr, err)
	}
	if isLoopback(host) {
		return nil
	}
	return fmt.Errorf("refusing to serve on %s without tokens: set --join-token and --admin-token, or --insecure to run open", c.addr)
}

// loopback says whether --addr is a loopback address.
func (c *serveConfig) loopback() bool {
	host, _, err := net.SplitHostPort(c.addr)
	return err == nil && isLoopback(host)
}

// parseAccessLog reads --access-log as router.Config.LogServedEvery:
// errors is 0, all is 1, sample:N is N.
func parseAccessLog(s string) (int, error) {
	switch s {
	case "errors":
		return 0, nil
	case "all":
		return 1, nil
	}
	n, ok := strings.CutPrefix(s, "sample:")
	if !ok {
		return 0, errors.New("not errors, all or sample:N")
	}
	every, err := strconv.Atoi(n)
	if err != nil || every < 1 {
		return 0, errors.New("sample:N needs an integer N of at least 1")
	}
	return every, nil
}

// formatAccessLog is parseAccessLog's inverse.
func formatAccessLog(every int) string {
	switch every {
	case 0:
		return "errors"
	case 1:
		return "all"
	}
	return "sample:" + strconv.Itoa(every)
}

// isLoopback says whether host (a name or an IP) is this machine only.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// startControlPlane opens the store and serves until wait returns.
func startControlPlane(ctx context.Context, c serveConfig, log zerolog.Logger) (*controlPlane, error) {
	if err := c.checkExposure(); err != nil {
		return nil, err
	}
	if c.shutdownGrace < 0 {
		return nil, fmt.Errorf("--shutdown-grace must not be negative, got %s", c.shutdownGrace)
	}
	if c.peerToken != "" {
		log.Warn().Msg("--peer-token is deprecated: use --join-token (a comma-separated list)")
	}
	tp, err := startTracing(ctx, c, log)
	if err != nil {
		return nil, err
	}
	store, err := openStore(ctx, c, log)
	if err != nil {
		_ = tp.Shutdown(ctx)
		return nil, err
	}
	store = tracing.NewStore(store, tp.TracerProvider())
	cp := &controlPlane{log: log, store: store, tracing: tp, errc: make(chan error, 1), grace: c.shutdownGrace}
	// Not ctx: the signal that ends ctx starts the drain, during which
	// the routes must stay current.
	bgCtx, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	cp.bgCancel = bgCancel
	ok := false
	defer func() {
		if !ok {
			cp.close()
		}
	}()
	mirror := replica.NewMirror(replica.MirrorConfig{LoadRefresh: c.heartbeat}, store, log.With().Str("component", "mirror").Logger())
	cp.mirror = mirror
	if err := mirror.Start(bgCtx); err != nil {
		return nil, fmt.Errorf("load registry: %w", err)
	}
	sweeper, err := registry.NewLeaseSweeper(registry.SweeperConfig{LeaseTTL: c.leaseTTL}, store, log.With().Str("component", "sweeper").Logger())
	if err != nil {
		return nil, err
	}
	cp.bg.Go(func() { sweeper.Run(bgCtx) })
	if c.quarantineTTL > 0 {
		qs := &registry.QuarantineSweeper{Store: store, Log: log.With().Str("component", "quarantine-sweeper").Logger()}
		cp.bg.Go(func() { qs.Run(bgCtx) })
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rcfg := router.Config{Replica: c.replica, PrefillPolicy: router.Policy(c.prefillPolicy), DecodePolicy: router.Policy(c.decodePolicy),
		DecodeFirstByteTimeout: c.decodeFirstByteTimeout, PrefillTimeout: c.prefillTimeout, MaxInflight: c.maxInflight, TracerProvider: tp.TracerProvider()}
	rcfg.LogServedEvery, rcfg.DisableTakeover, rcfg.RouteReceipt = c.logServedEvery, !c.takeover, c.receipt
	if c.apiKeys != "" {
		rcfg.APIKeys = strings.Split(c.apiKeys, ",")
	}
	cp.router, err = router.New(rcfg, mirror, store, log.With().Str("component", "router").Logger(), reg)
	if err != nil {
		return nil, err
	}
	peerNets, err := server.ParsePeerNetworks(c.allowPeerNetworks)
	if err != nil {
		return nil, fmt.Errorf("--allow-peer-networks: %w", err)
	}
	srv, err := server.New(server.Config{
		AdminToken: c.adminToken, JoinTokens: c.tokens(), Version: version,
		HeartbeatInterval: c.heartbeat, LeaseTTL: c.leaseTTL,
		BodyTimeout: c.bodyTimeout, MaxEventStreams: c.maxEventStreams, AllowedHosts: splitList(c.allowedHosts), Loopback: c.loopback(),
		PeerNetworks: server.PeerNetworkPolicy{Allow: peerNets},
		Replica:      c.replica, StoreKind: storeKind(c),
	}, server.Deps{Store: store, Snaps: mirror, Registry: reg, Routes: cp.router, Breakers: cp.router, Web: web.Handler()},
		log.With().Str("component", "server").Logger())
	if err != nil {
		return nil, err
	}
	cp.srv = srv
	if c.adminToken == "" && len(c.tokens()) == 0 {
		log.Warn().Msg("no --admin-token or --join-token: the control-plane API accepts writes from anyone who can reach it")
	}
	if c.pprofAddr != "" {
		if cp.pprof, err = startPprof(c.pprofAddr, log); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", c.addr, err)
	}
	// No WriteTimeout: it would cut event and generation streams. Request
	// bodies are bounded per request by the server (--body-timeout).
	handler := tracing.ContinueTrace(srv.Handler(), tp.TracerProvider())
	counted := cp.inflight.Handler(handler)
	cp.hs = &http.Server{Handler: counted, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	cp.BaseURL = "http://" + ln.Addr().String()
	log.Info().Str("addr", ln.Addr().String()).Str("openai_base_url", cp.BaseURL+"/v1").
		Str("status_page", cp.BaseURL+"/").Msg("pdplane listening")
	cp.ln = httpwire.NewListener(ln, cp.hs.IdleTimeout)
	if c.front {
		cp.ln.Front(counted, cp.hs.ReadHeaderTimeout, cp.router.Watcher())
	}
	go func() { cp.errc <- cp.hs.Serve(cp.ln) }()
	ok = true
	return cp, nil
}

// wait serves until ctx ends, then shuts down within --shutdown-grace
// (nil), or until the server fails (its error).
func (cp *controlPlane) wait(ctx context.Context) error {
	if err := cp.serveUntil(ctx); err != nil {
		return err
	}
	drain, stop := cp.drainContext()
	defer stop()
	cp.shutdown(drain)
	return nil
}

// serveUntil serves until ctx ends (nil: call shutdown next) or the
// server fails (its error, everything closed).
func (cp *controlPlane) serveUntil(ctx context.Context) error {
	select {
	case err := <-cp.errc:
		cp.close()
		return err
	case <-ctx.Done():
		return nil
	}
}

// drainContext is the shutdown's time: it ends when --shutdown-grace has
// passed since the call (the signal), or at once on a second SIGTERM or
// SIGINT, for an operator who will not wait.
func (cp *controlPlane) drainContext() (context.Context, context.CancelFunc) {
	timed, cancelTimer := context.WithTimeoutCause(context.Background(), cp.grace,
		fmt.Errorf("the shutdown grace (%s) passed", cp.grace))
	ctx, cancelCause := context.WithCancelCause(timed)
	cancel := func() { cancelCause(nil); cancelTimer() }
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	stopped := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case sig := <-sigs:
			cp.log.Warn().Str("signal", sig.String()).Msg("second signal: cutting what is still in flight now")
			cancelCause(fmt.Errorf("a second %s", sig))
		case <-ctx.Done():
		case <-stopped:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		once.Do(func() { close(stopped) })
		cancel()
	}
}

// shutdown stops the control plane gracefully (server.Shutdown: the
// requests in flight finish within drain, then what is left is cut), then
// the background pieces and the store. A clean exit either way: the cut is
// the grace's promise, not a failure.
func (cp *controlPlane) shutdown(drain context.Context) {
	start := time.Now()
	cp.log.Info().Dur("grace", cp.grace).Msg("shutting down")
	sd := &server.Shutdown{Server: cp.srv, HTTP: cp.hs, InFlight: &cp.inflight, Conns: cp.ln, Detached: cp.router, Log: cp.log}
	sd.Run(drain)
	cp.closeWithin(drain)
	cp.log.Info().Dur("took", time.Since(start)).Msg("shut down")
}

// close stops the background pieces, the router and the store, and
// exports the spans still buffered. It is idempotent.
func (cp *controlPlane) close() { cp.closeWithin(context.Background()) }

// closeWithin is close, the spans' export bounded by what is left of ctx
// (at least traceFlushMin).
func (cp *controlPlane) closeWithin(ctx context.Context) {
	cp.closeOnce.Do(func() {
		if cp.bgCancel != nil {
			cp.bgCancel()
		}
		cp.bg.Wait()
		if cp.pprof != nil {
			_ = cp.pprof.Close()
		}
		if cp.router != nil {
			cp.router.Close()
		}
		cp.store.Close()
		cp.flushTraces(ctx)
	})
}

// traceFlushMin is the least time the spans still buffered get to leave at
// shutdown, even when the grace is spent: they are what explains a cut.
const traceFlushMin = 2 * time.Second

// flushTraces exports the spans still buffered, within what is left of
// the drain (at least traceFlushMin).
func (cp *controlPlane) flushTraces(drain context.Context) {
	if !cp.tracing.Enabled() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(drain), traceFlushMin)
	if dl, ok := drain.Deadline(); ok && time.Until(dl) > traceFlushMin {
		ctx, cancel = context.WithDeadline(context.WithoutCancel(drain), dl)
	}
	defer cancel()
	if err := cp.tracing.Shutdown(ctx); err != nil {
		cp.log.Warn().Err(err).Msg("shutdown: spans not exported")
	}
}

// startTracing builds the tracer provider --otlp-endpoint and the OTEL_*
// variables ask for, and sends the SDK's own errors (an unreachable
// collector) to the log.
func startTracing(ctx context.Context, c serveConfig, log zerolog.Logger) (*tracing.Provider, error) {
	replica := c.replica
	if replica == "" {
		replica, _ = os.Hostname()
	}
	tp, err := tracing.New(ctx, tracing.Config{Endpoint: c.otlpEndpoint, Version: version, Replica: replica})
	if err != nil {
		return nil, err
	}
	if tp.Enabled() {
		tlog := log.With().Str("component", "tracing").Logger()
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { tlog.Warn().Err(err).Msg("tracing") }))
		tlog.Info().Str("otlp_endpoint", c.otlpEndpoint).Msg("exporting traces over OTLP/HTTP")
	}
	return tp, nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// storeKind names the store openStore opens, for the status page.
func storeKind(c serveConfig) string {
	if c.databaseURL == "" {
		return "memory"
	}
	return "postgres"
}

func openStore(ctx context.Context, c serveConfig, log zerolog.Logger) (registry.Store, error) {
	if c.databaseURL == "" {
		log.Info().Str("store", "memory").Msg("using the embedded in-memory registry store (single node); set --database-url for PostgreSQL")
		return memstore.New(memstore.Config{LeaseTTL: c.leaseTTL, Heal: c.heal, QuarantineTTL: c.quarantineTTL}), nil
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := pgstore.Open(openCtx, pgstore.Config{URL: c.databaseURL, LeaseTTL: c.leaseTTL, QuarantineTTL: c.quarantineTTL, Migrate: true, Heal: c.heal},
		log.With().Str("component", "pgstore").Logger())
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	log.Info().Str("store", "postgres").Msg("using the PostgreSQL registry store (migrated)")
	return s, nil
}

func runMigrate(ctx context.Context, args []string) error {
	var url string
	fs := cli.NewFlagSet("migrate")
	fs.Str(&url, "database-url", "", "PostgreSQL URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if url == "" {
		return errors.New("--database-url (or $PDPLANE_DATABASE_URL) is required")
	}
	if err := pgstore.Migrate(ctx, url); err != nil {
		return err
	}
	fmt.Println("migrations applied")
	return nil
}

func newLogger(level string, console bool) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Logger{}, fmt.Errorf("--log-level: %w", err)
	}
	var log zerolog.Logger
	if console {
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly})
	} else {
		log = zerolog.New(os.Stderr)
	}
	return log.Level(lvl).With().Timestamp().Logger(), nil
}
