package sim

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// Sim is one simulated engine: an HTTP server speaking SGLang's or vLLM's
// protocol, a KV pool in host memory, and a transfer agent moving that
// pool's bytes. It implements agent.Engine. Create it with New, then Start;
// Close releases everything.
type Sim struct {
	cfg        Config
	log        zerolog.Logger
	pool       *kvPool
	instanceID string

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	ln, bootLn    net.Listener
	srv, bootSrv  *http.Server
	client        *http.Client
	host, url     string
	bootstrapPort int
	// rankLn is the engine's rank socket (SGLang's ZeroMQ PULL on
	// rank_port); a prefill reads decodes' KV args and destinations there,
	// one message at a time (rankMu).
	rankLn   net.Listener
	rankPort int
	rankMu   sync.Mutex

	regMu sync.Mutex // serialises Start, Reregister and Close
	state atomic.Pointer[agentState]
	// pair is the decode's agent toward the one prefill that a
	// pair-limited missing-mem-kind fault breaks (SetPairFault); nil when
	// none. That prefill registered it without memory kinds; every other
	// prefill keeps sending to the decode's own agent (state).
	pair atomic.Pointer[pairAgent]

	peerID atomic.Pointer[string]

	faultMu sync.Mutex
	fault   Fault
	// faultPort, when not zero, limits the missing-mem-kind fault to the
	// pair with the prefill whose bootstrap server listens on it.
	faultPort   int
	crashCtx    context.Context // cancelled while crashed
	crashCancel context.CancelFunc

	gateMu   sync.Mutex
	closing  bool
	inflight sync.WaitGroup // HTTP handlers
	bg       sync.WaitGroup // background goroutines

	decRooms decodeRooms  // SGLang decode: rooms waiting for KV
	preRooms prefillRooms // SGLang prefill: rooms waiting for a decode
	decodes  decodeTable  // SGLang prefill: decode KV args by agent name
	boot     sglangBoot   // SGLang prefill: the bootstrap server's tables
	pushers  pushers      // SGLang decode: connections to prefill ranks
	held     heldBlocks   // vLLM prefill: blocks held for decodes
	sides    sideChannels // vLLM decode: prefill agents by engine id
	kick     chan struct{}

	// cache is a prefill's prefix cache (nil on a decode); computeQ, the
	// turns prompts take at the compute; events, the KV events publisher
	// (nil unless Config.KVEventsAddr).
	cache    *prefixCache
	computeQ computeQueue
	events   *kvEvents

	running, queued atomic.Int64
	counters        counters
	received        receivedLog // when cfg.LogRequests
	reqSeq          atomic.Uint64
	started         atomic.Bool
	// startedAt is the process start time the engine publishes as
	// process_start_time_seconds; set before serving starts.
	startedAt time.Time
	closeOnce sync.Once
}

// New checks cfg and allocates the KV pool; Start serves.
func New(cfg Config, log zerolog.Logger) (*Sim, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pool, err := newKVPool(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sim{
		cfg:        cfg,
		log:        log.With().Str("component", "sim").Str("sim", cfg.Name).Str("role", string(cfg.Role)).Logger(),
		pool:       pool,
		instanceID: cfg.Name + "-" + randomSuffix(12),
		ctx:        ctx,
		cancel:     cancel,
		kick:       make(chan struct{}, 1),
		client: &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		}},
	}
	s.computeQ.slots = cfg.PrefillSlots
	if cfg.Role == registry.RolePrefill {
		s.cache = newPrefixCache(cfg.PageSize, cmp.Or(cfg.PrefixCachePages, cfg.Pages))
	}
	if cfg.KVEventsAddr != "" {
		s.events = newKVEvents(cfg, s.log)
		s.cache.onChange = s.events.publishChange
	}
	s.crashCtx, s.crashCancel = context.WithCancel(context.Background())
	s.decRooms.init()
	s.preRooms.init(cfg.RoomTimeout)
	s.decodes.init()
	s.boot.init()
	s.pushers.init()
	s.held.init()
	s.sides.init()
	return s, nil
}

// Start creates the transfer agent, binds the HTTP listener (and, on a
// prefill, the bootstrap listener) and serves until Close or until ctx
// ends. Call Close even when Start fails. URL, BootstrapPort and Spec are
// valid once Start returned nil.
func (s *Sim) Start(ctx context.Context) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if s.ctx.Err() != nil {
		return fmt.Errorf("sim %s: %w", s.cfg.Name, transfer.ErrClosed)
	}
	if s.started.Load() {
		return fmt.Errorf("sim %s already started", s.cfg.Name)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	st, err := s.newAgentState(1)
	if err != nil {
		return err
	}
	s.state.Store(st)

	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	s.ln = ln
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1" // listening everywhere: loopback reaches it
	}
	if s.cfg.AdvertiseHost != "" {
		host = s.cfg.AdvertiseHost
	}
	s.host = host
	s.url = "http://" + net.JoinHostPort(host, port)
	s.srv = s.newServer(s.routes(), true)
	bh, _, _ := net.SplitHostPort(s.cfg.Addr)
	if s.cfg.Engine == registry.EngineSGLang {
		if err := s.listenRank(bh); err != nil {
			return err
		}
	}
	if s.cfg.Role == registry.RolePrefill {
		bl, err := net.Listen("tcp", net.JoinHostPort(bh, strconv.Itoa(s.cfg.BootstrapPort)))
		if err != nil {
			return fmt.Errorf("listen on bootstrap port %d: %w", s.cfg.BootstrapPort, err)
		}
		s.bootLn = bl
		s.bootstrapPort = bl.Addr().(*net.TCPAddr).Port
		s.bootSrv = s.newServer(s.bootstrapRoutes(), false)
		s.bg.Go(func() { s.serve(s.bootSrv, bl) })
		if s.cfg.Engine == registry.EngineSGLang {
			if err := s.registerRank(ctx); err != nil {
				return err
			}
		}
	}
	if s.events != nil {
		if err := s.events.listen(s.host); err != nil {
			return err
		}
		s.bg.Go(s.events.serve)
	}
	s.startedAt = s.cfg.Now()
	s.bg.Go(func() { s.serve(s.srv, ln) })
	s.bg.Go(s.pollNotifs)
	s.started.Store(true)
	stop := context.AfterFunc(ctx, func() { s.Close() })
	go func() {
		<-s.ctx.Done()
		stop()
	}()
	s.log.Info().Str("url", s.url).Int("bootstrap_port", s.bootstrapPort).Str("engine", string(s.cfg.Engine)).
		Str("agent", st.name).Str("transfer", s.cfg.Transfer).Msg("sim started")
	return nil
}

// bodyTimeout bounds how long a client may take to send a request body, as
// on the control plane (httpwire.BodyDeadline); there is no WriteTimeout,
// which would cut generation streams.
const bodyTimeout = 30 * time.Second

// newServer serves h: the engine's own API (engine), or SGLang's bootstrap
// server, which runs beside the scheduler and answers while a wedged
// engine does not (the hang fault).
func (s *Sim) newServer(h http.Handler, engine bool) *http.Server {
	return &http.Server{
		Handler:           s.gate(httpwire.BodyDeadline(bodyTimeout)(h), engine),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
	}
}

func (s *Sim) serve(srv *http.Server, ln net.Listener) {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error().Err(err).Msg("http server stopped")
	}
}

// gate counts handlers in flight, so that Close can wait for them before it
// unmaps the pool, drops connections while the sim is "crashed", and holds
// the engine's requests while it is "hung".
func (s *Sim) gate(next http.Handler, engine bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.gateMu.Lock()
		if s.closing {
			s.gateMu.Unlock()
			writeError(w, http.StatusServiceUnavailable, "engine is shutting down", "ServiceUnavailable")
			return
		}
		s.inflight.Add(1)
		s.gateMu.Unlock()
		defer s.inflight.Done()
		if s.crashed() && r.URL.Path != faultPath {
			panic(http.ErrAbortHandler) // a dead engine answers nothing
		}
		if engine && s.hung() && r.URL.Path != faultPath {
			s.hang(r) // a wedged one accepts and never answers
		}
		next.ServeHTTP(w, r)
	})
}

// Close stops serving, cancels requests in flight, waits for them and for
// the transfers they started, closes the transfer agent and unmaps the KV
// pool. It is idempotent.
func (s *Sim) Close() {
	s.closeOnce.Do(func() {
		s.regMu.Lock()
		defer s.regMu.Unlock()
		s.gateMu.Lock()
		s.closing = true
		s.gateMu.Unlock()
		s.cancel()
		for _, srv := range []*http.Server{s.srv, s.bootSrv} {
			if srv != nil {
				srv.Close()
			}
		}
		if s.rankLn != nil {
			s.rankLn.Close()
		}
		if s.events != nil {
			s.events.close()
		}
		s.pushers.closeAll()
		s.inflight.Wait()
		s.held.releaseAll(s.pool)
		s.bg.Wait()
		if pa := s.pair.Swap(nil); pa != nil {
			pa.st.close(s.log)
		}
		if st := s.state.Swap(nil); st != nil {
			st.close(s.log)
		}
		s.client.CloseIdleConnections()
		s.crashCancel()
		if err := s.pool.close(); err != nil {
			s.log.Warn().Err(err).Msg("unmap KV pool")
		}
		s.log.Info().Msg("sim closed")
	})
}

// URL is the base URL of the engine's HTTP API ("" before Start).
func (s *Sim) URL() string { return s.url }

// BootstrapPort is the prefill's bootstrap (SGLang) or side-channel (vLLM)
// port; 0 on a decode or before Start.
func (s *Sim) BootstrapPort() int { return s.bootstrapPort }

// KVEventsEndpoints are where the prefill publishes its KV events and
// replays them, as vLLM's --kv-events-config names them
// ("tcp://host:port"), for the wiring to publish; "" when it does not
// (Config.KVEventsAddr, Config.KVEventsReplayAddr), or before Start.
func (s *Sim) KVEventsEndpoints() (endpoint, replayEndpoint string) {
	if s.events == nil {
		return "", ""
	}
	return s.events.endpoints()
}

// kvEvents is the registration's KV events publisher: none when the sim
// publishes no events.
func (s *Sim) kvEvents() registry.KVEvents {
	ep, replay := s.KVEventsEndpoints()
	if ep == "" {
		return registry.KVEvents{}
	}
	return registry.KVEvents{Endpoint: ep, ReplayEndpoint: replay, Topic: s.cfg.KVEventsTopic}
}

// Config returns the configuration the sim runs with (defaults applied).
func (s *Sim) Config() Config { return s.cfg }

// InstanceID changes with every process (every New).
func (s *Sim) InstanceID() string { return s.instanceID }

// AgentName is the current transfer agent's name ("" before Start).
func (s *Sim) AgentName() string {
	if st := s.state.Load(); st != nil {
		return st.name
	}
	return ""
}

// Generation is the current transfer agent's generation: 1 at Start, one
// more at every Reregister.
func (s *Sim) Generation() int64 {
	if st := s.state.Load(); st != nil {
		return st.gen
	}
	return 0
}

// SetPeerID records the peer ID the control plane gave this engine; the
// wiring calls it from the agent's OnRegistered. A decode sends it to the
// prefills it gets KV from, so that they can report it stale.
func (s *Sim) SetPeerID(id string) { s.peerID.Store(&id) }

// PeerID is the ID recorded by SetPeerID ("" before).
func (s *Sim) PeerID() string {
	if p := s.peerID.Load(); p != nil {
		return *p
	}
	return ""
}

// Spec describes the engine for registration (agent.Engine): its identity,
// URL and bootstrap port, TP 1, the KV geometry, and one rank whose regions
// are the pool's K and V buffers (DRAM), with the current agent's name and
// metadata.
func (s *Sim) Spec(ctx context.Context) (registry.PeerSpec, error) {
	st := s.state.Load()
	if st == nil || s.url == "" {
		return registry.PeerSpec{}, fmt.Errorf("sim %s is not started", s.cfg.Name)
	}
	g := st.geometry
	spec := registry.PeerSpec{
		Name:          s.cfg.Name,
		Role:          s.cfg.Role,
		Engine:        s.cfg.Engine,
		URL:           s.url,
		Model:         s.cfg.Model,
		InstanceID:    s.instanceID,
		TransferGroup: s.cfg.TransferGroup,
		Labels:        maps.Clone(s.cfg.Labels),
		Parallelism:   registry.Parallelism{TPSize: 1, AttnTPSize: 1, DPSize: 1, PPSize: 1, DCPSize: 1},
		KVEvents:      s.kvEvents(),
		KV: registry.KVGeometry{
			PageSize: s.cfg.PageSize, DType: s.cfg.DType, NumLayers: s.cfg.NumLayers,
			NumKVHeads: s.cfg.NumKVHeads, HeadDim: s.cfg.HeadDim,
		},
		Ranks: []registry.Rank{{
			Rank: 0, GPUID: 0,
			AgentName:      st.name,
			AgentMetadata:  append([]byte(nil), st.metadata...),
			TransferSecret: bytes.Clone(st.secret),
			KVDataPtrs:     append([]uint64(nil), g.KVDataPtrs...),
			KVDataLens:     append([]uint64(nil), g.KVDataLens...),
			KVItemLens:     append([]uint64(nil), g.KVItemLens...),
			KVMemKinds:     append([]registry.MemKind(nil), g.KVMemKinds...),
		}},
	}
	if s.cfg.Role == registry.RolePrefill && s.cfg.Engine == registry.EngineSGLang {
		spec.BootstrapPort = s.bootstrapPort
		if s.cfg.AdvertiseHost != "" {
			spec.BootstrapHost = s.cfg.AdvertiseHost
		}
	}
	return spec, nil
}

// Reregister gives the engine a fresh transfer agent (agent.Engine): a new
// agent name, the pool registered again, new metadata, generation + 1. The
// old agent is closed once its transfers finish. It clears the
// missing-mem-kind fault: the fresh agent's KV args are prepared correctly
// by every prefill, which is how a real fleet heals.
func (s *Sim) Reregister(ctx context.Context, reason string) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if s.ctx.Err() != nil {
		return fmt.Errorf("sim %s: %w", s.cfg.Name, transfer.ErrClosed)
	}
	old := s.state.Load()
	if old == nil {
		return fmt.Errorf("sim %s is not started", s.cfg.Name)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	next, err := s.newAgentState(old.gen + 1)
	if err != nil {
		return fmt.Errorf("re-register: %w", err)
	}
	s.faultMu.Lock()
	if s.fault == FaultMissingMemKind {
		s.fault, s.faultPort = FaultNone, 0
	}
	s.faultMu.Unlock()
	s.state.Store(next)
	old.close(s.log)
	if pa := s.pair.Swap(nil); pa != nil {
		pa.st.close(s.log)
	}
	s.counters.reregistrations.Add(1)
	s.log.Info().Str("reason", reason).Str("old_agent", old.name).Str("agent", next.name).Int64("generation", next.gen).Msg("re-registered with a fresh transfer agent")
	return nil
}

// pairAgent is the agent a decode uses toward one prefill only: the one
// whose bootstrap server listens on port.
type pairAgent struct {
	port int
	st   *agentState
}

// stateFor is the agent a decode sends its KV args and destinations under
// to the prefill whose bootstrap server listens on port.
func (s *Sim) stateFor(port int) *agentState {
	if pa := s.pair.Load(); pa != nil && pa.port == port {
		return pa.st
	}
	return s.state.Load()
}

// breakPair starts the missing-mem-kind fault of one pair: toward the
// prefill on port only, the decode takes a fresh agent of the same
// generation (a restart of that registration), whose KV args it sends
// without memory kinds. The other prefills keep the decode's own agent,
// registered with the control plane, and keep sending; the broken entry
// stays until Reregister, as SGLang's does.
func (s *Sim) breakPair(port int) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	cur := s.state.Load()
	if cur == nil || s.ctx.Err() != nil {
		return nil
	}
	st, err := s.newAgentState(cur.gen)
	if err != nil {
		return fmt.Errorf("missing-mem-kind fault: a fresh agent toward one prefill: %w", err)
	}
	if old := s.pair.Swap(&pairAgent{port: port, st: st}); old != nil {
		old.st.close(s.log)
	}
	s.log.Warn().Str("agent", st.name).Int("bootstrap_port", port).Msg("missing-mem-kind fault: a fresh agent toward one prefill")
	return nil
}

// breakRegistrations starts the missing-mem-kind fault. An SGLang decode
// takes a fresh agent of the same generation, so that its next
// registration with every prefill is a first one (and, under the fault,
// a broken one); a vLLM decode drops the prefills it loaded, so that it
// prepares them again (and, under the fault, fails to).
func (s *Sim) breakRegistrations() error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	old := s.state.Load()
	if old == nil || s.ctx.Err() != nil {
		return nil
	}
	if s.cfg.Engine == registry.EngineVLLM {
		if err := old.evictReads(); err != nil {
			s.log.Warn().Err(err).Msg("evict loaded prefills")
		}
		return nil
	}
	next, err := s.newAgentState(old.gen)
	if err != nil {
		return fmt.Errorf("missing-mem-kind fault: a fresh agent: %w", err)
	}
	s.state.Store(next)
	old.close(s.log)
	s.log.Warn().Str("old_agent", old.name).Str("agent", next.name).Msg("missing-mem-kind fault: the decode's KV manager restarted with a fresh agent")
	return nil
}

// Load reports the engine's work, as its load endpoints publish it:
// requests generating or prefilling, requests waiting (for their turn at
// the compute, for KV, or for a decode to take it), and the fraction of the
// pool in use.
func (s *Sim) Load() registry.Load {
	q := s.queued.Load() + int64(s.computeQ.state().waiting)
	r := s.running.Load() - q // a waiting request's handler counts in running too
	return registry.Load{Running: int(max(r, 0)), Queued: int(max(q, 0)), KVUsage: s.pool.usage()}
}

// onTransferError calls the hook, if any.
func (s *Sim) onTransferError(peerID, agentName string, err error) {
	if s.cfg.OnTransferError != nil {
		s.cfg.OnTransferError(peerID, agentName, err)
	}
}

// nextID returns a request id unique within the process.
func (s *Sim) nextID() string {
	return s.cfg.Name + "-" + strconv.FormatUint(s.reqSeq.Add(1), 10)
}
