package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"
)

// Peers the harness knows how to run, and the engines each is compared on.
const (
	PeerSMG        = "smg"         // SMG, SGLang PD
	PeerVLLMRouter = "vllm-router" // vllm-router, vLLM PD
	// PeerFloor is Floor (`pdplane bench floor`), SGLang PD: not a router
	// but the least any Go process spends on the same traffic.
	PeerFloor = "floor"
	// PeerFloorNetHTTP is Floor with net/http's server on the client side
	// (`pdplane bench floor --net-http`).
	PeerFloorNetHTTP = "floor-net-http"
	// PeerBaseline is another pdplane binary's serve, with engines of its
	// own from the pdplane under test: a change measured against the
	// commit before it in alternating windows of one run, so the host's
	// drift between runs does not decide the result.
	PeerBaseline = "baseline"
)

// Peer is a router to compare pdplane with.
type Peer struct {
	Name string // PeerSMG, PeerVLLMRouter, PeerFloor, PeerFloorNetHTTP or PeerBaseline
	Bin  string // its executable (for the floors and the baseline, a pdplane binary)
}

// engine is the engine kind the peer routes.
func (p Peer) engine() string {
	if p.Name == PeerVLLMRouter {
		return "vllm"
	}
	return "sglang"
}

// Mode is how the load asks for its answers.
type Mode string

// Modes.
const (
	Stream Mode = "stream" // SSE, time to first token is the first event
	Unary  Mode = "unary"  // one JSON answer
)

// Config configures Compare.
type Config struct {
	// Pdplane is the pdplane binary (serve and sim). Required.
	Pdplane string
	// Peers are the routers to compare with; none measures pdplane alone.
	Peers []Peer
	// Window is the length of one measured window; default 8s.
	Window time.Duration
	// Concurrency lists the numbers of concurrent clients; default 32.
	Concurrency []int
	// Modes lists stream and/or unary; default stream.
	Modes []Mode
	// Rounds is how many windows each router gets per (mode, concurrency),
	// alternating pdplane, peer, then peer, pdplane, and so on; default 2.
	Rounds int
	// HeldStreams lists the numbers of streams held open on a slow decode
	// (levels, measured in increasing order through the same routers) to
	// measure memory and descriptors per stream and the time to first
	// token of new requests while they are held; empty skips it.
	HeldStreams []int
	// ProbeClients is how many concurrent clients send new requests while
	// the streams of a level are held; default 8.
	ProbeClients int
	// ProbeWindow is how long they send them; default 2s.
	ProbeWindow time.Duration
	// ProbeRounds is how many such windows each level gets, back to
	// back; default 3. The level's p99 is the median of the windows'
	// p99s: one window's tail on two shared cores is mostly what else
	// ran during it.
	ProbeRounds int
	// HeldTokenTime is the slow decode's time per token, so each held
	// stream's pace; default 1s. Longer, the held streams are idle more
	// than they stream.
	HeldTokenTime time.Duration
	// MaxTokens is the answer length of each request; default 16.
	MaxTokens int
	// Progress, when set, receives a line per step.
	Progress io.Writer
}

// WithDefaults returns the config with unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Window = cmp.Or(c.Window, 8*time.Second)
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{32}
	}
	if len(c.Modes) == 0 {
		c.Modes = []Mode{Stream}
	}
	c.Rounds = cmp.Or(c.Rounds, 2)
	c.MaxTokens = cmp.Or(c.MaxTokens, 16)
	c.ProbeClients = cmp.Or(c.ProbeClients, 8)
	c.ProbeWindow = cmp.Or(c.ProbeWindow, 2*time.Second)
	c.ProbeRounds = cmp.Or(c.ProbeRounds, 3)
	c.HeldTokenTime = cmp.Or(c.HeldTokenTime, time.Second)
	c.HeldStreams = slices.Compact(slices.Sorted(slices.Values(c.HeldStreams)))
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Pdplane == "":
		return errors.New("bench config: pdplane: the binary is required")
	case c.Window < 100*time.Millisecond:
		return fmt.Errorf("bench config: window: at least 100ms, got %v", c.Window)
	case c.Rounds < 1:
		return fmt.Errorf("bench config: rounds: at least 1, got %d", c.Rounds)
	case c.ProbeClients < 1:
		return fmt.Errorf("bench config: probe_clients: at least 1, got %d", c.ProbeClients)
	case c.ProbeRounds < 1:
		return fmt.Errorf("bench config: probe_rounds: at least 1, got %d", c.ProbeRounds)
	case c.ProbeWindow < 100*time.Millisecond:
		return fmt.Errorf("bench config: probe_window: at least 100ms, got %v", c.ProbeWindow)
	case c.HeldTokenTime < time.Millisecond:
		return fmt.Errorf("bench config: held_token_time: at least 1ms, got %v", c.HeldTokenTime)
	case c.MaxTokens < 1:
		return fmt.Errorf("bench config: max_tokens: at least 1, got %d", c.MaxTokens)
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			return fmt.Errorf("bench config: concurrency: at least 1, got %d", n)
		}
	}
	for _, n := range c.HeldStreams {
		if n < 1 {
			return fmt.Errorf("bench config: held_streams: at least 1 stream a level, got %d", n)
		}
	}
	for _, m := range c.Modes {
		if m != Stream && m != Unary {
			return fmt.Errorf("bench config: modes: stream or unary, got %q", m)
		}
	}
	for _, p := range c.Peers {
		switch p.Name {
		case PeerSMG, PeerVLLMRouter, PeerFloor, PeerFloorNetHTTP, PeerBaseline:
		default:
			return fmt.Errorf("bench config: peers: %s, %s, %s, %s or %s, got %q", PeerSMG, PeerVLLMRouter, PeerFloor, PeerFloorNetHTTP, PeerBaseline, p.Name)
		}
	}
	return nil
}

// Stats is one router's figures for one (mode, concurrency), over all its
// windows.
type Stats struct {
	Requests   int           // served (a window's last ones finish after its end)
	Failed     int           // answered with an error
	FirstError string        // the first failure's text
	Elapsed    time.Duration // the windows' total length, until their last request ended
	CPU        time.Duration // router CPU over the windows
	// EngineCPU is the CPU of the engines behind the router (its
	// prefill and decode sims) over the same windows: what the same
	// requests cost them, which the router's CPU shares the machine with.
	EngineCPU time.Duration
	TTFT50    time.Duration // client-side time to first token, p50
	TTFT99    time.Duration // and p99
}

// EngineCPUPerRequest is the engines' CPU time per request served.
func (s Stats) EngineCPUPerRequest() time.Duration {
	if s.Requests == 0 {
		return 0
	}
	return s.EngineCPU / time.Duration(s.Requests)
}

// ReqPerSec is requests served per second of window.
func (s Stats) ReqPerSec() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Requests) / s.Elapsed.Seconds()
}

// CPUPerRequest is router CPU time per request served.
func (s Stats) CPUPerRequest() time.Duration {
	if s.Requests == 0 {
		return 0
	}
	return s.CPU / time.Duration(s.Requests)
}

// Row is one (mode, concurrency) of one comparison: pdplane and the peer
// (or pdplane alone) under the same load.
type Row struct {
	Mode        Mode
	Concurrency int
	Pdplane     Stats
	Peer        *Stats // nil without a peer
}

// Comparison is pdplane against one peer (or alone) on one engine kind.
type Comparison struct {
	Peer   string // "" when pdplane ran alone
	Engine string
	Rows   []Row
	// HeldPdplane and HeldPeer are the held-stream figures, one per level
	// of Config.HeldStreams in increasing order; empty when not measured.
	HeldPdplane, HeldPeer []Held
}

// Report is what Compare measured.
type Report struct {
	Config      Config
	Comparisons []Comparison
	// FDLimit is the limit on open files the harness and the processes it
	// started ran under (RaiseFDLimit).
	FDLimit uint64
}

// Compare runs every comparison of cfg; with no peer, pdplane alone on the
// SGLang engines.
func Compare(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg}
	limit, err := RaiseFDLimit()
	if err != nil {
		return nil, err
	}
	rep.FDLimit = limit
	if need := fdsNeeded(cfg); uint64(need) > limit {
		fmt.Fprintf(cfg.Progress, "bench: warning: %d held streams need about %d open files in the router, above the limit of %d: the largest levels will not all open\n",
			maxOf(cfg.HeldStreams), need, limit)
	}
	peers := cfg.Peers
	if len(peers) == 0 {
		peers = []Peer{{}}
	}
	for _, p := range peers {
		c, err := compareWith(ctx, cfg, p)
		if err != nil {
			return rep, err
		}
		rep.Comparisons = append(rep.Comparisons, *c)
	}
	return rep, nil
}

// target is a router under measurement.
type target struct {
	name    string
	proc    *Process
	url     string
	engines []*Sim // the prefill and decode it routes to
}

// engineCPU is the CPU its engines have used so far.
func (t target) engineCPU() (time.Duration, error) {
	var sum time.Duration
	for _, e := range t.engines {
		u, err := ReadUsage(e.PID())
		if err != nil {
			return 0, fmt.Errorf("%s: %w", e.Name, err)
		}
		sum += u.CPU
	}
	return sum, nil
}

// compareWith runs the load windows, then the held streams, for pdplane
// and peer p (p.Name "" for pdplane alone).
func compareWith(ctx context.Context, cfg Config, p Peer) (*Comparison, error) {
	engine := p.engine()
	cmp := &Comparison{Peer: p.Name, Engine: engine}
	fmt.Fprintf(cfg.Progress, "bench: %s engines, pdplane vs %s: starting\n", engine, peerName(p))
	f, err := startFleet(ctx, cfg, p, fleetSpec{kvPages: kvPages(2 * maxOf(cfg.Concurrency)), cheap: true})
	if err != nil {
		return nil, err
	}
	defer f.close()
	for _, mode := range cfg.Modes {
		for _, conc := range cfg.Concurrency {
			row, err := f.measure(ctx, cfg, mode, conc)
			if err != nil {
				return nil, err
			}
			cmp.Rows = append(cmp.Rows, row)
		}
	}
	f.close()
	if len(cfg.HeldStreams) == 0 {
		return cmp, nil
	}
	// A slow decode (a token a second by default) holds every stream open.
	slow, err := startFleet(ctx, cfg, p, fleetSpec{
		kvPages: kvPages(maxOf(cfg.HeldStreams) + cfg.ProbeClients + 64), cheap: true, decodeTime: cfg.HeldTokenTime})
	if err != nil {
		return nil, err
	}
	defer slow.close()
	for i, t := range slow.targets() {
		hs, err := measureHeldLevels(ctx, cfg, slow, t)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			cmp.HeldPdplane = hs
		} else {
			cmp.HeldPeer = hs
		}
	}
	return cmp, nil
}

func peerName(p Peer) string {
	if p.Name == "" {
		return "nothing (pdplane alone)"
	}
	return p.Name
}

// kvPages sizes the engines' KV pools for n requests at once: one page
// each under cheap transfer (the prompt is short), doubled for pages still
// held while the next request starts. The simulator maps and touches the
// whole pool up front, so it is not oversized.
func kvPages(n int) int { return max(512, 2*n) }

// The engines' KV geometry under load: one layer of one head of 16, so that
// a page (16 tokens, a K and a V region, bfloat16) is 1 KiB rather than the
// simulator's default 32 KiB. What a request's transfer moves costs the
// engines, not the routers, and the engines share the routers' machine.
const (
	loadNumLayers  = 1
	loadNumKVHeads = 1
	loadHeadDim    = 16
)

// fleetSpec is how a fleet's engines run.
type fleetSpec struct {
	kvPages    int
	cheap      bool
	decodeTime time.Duration
}

// fleet is one prefill and one decode engine registered with a pdplane
// serve, and the peer router in front of the same engines (the baseline:
// in front of engines of its own).
type fleet struct {
	engine   string
	serve    *Process
	serveURL string
	prefill  *Sim
	decode   *Sim
	peer     *Process
	peerURL  string
	// peerEngines are the baseline's own engines; nil when the peer routes
	// to prefill and decode.
	peerEngines []*Sim
	procs       []*Process
	progress    io.Writer
}

func startFleet(ctx context.Context, cfg Config, p Peer, spec fleetSpec) (*fleet, error) {
	f := &fleet{engine: p.engine(), progress: cfg.Progress}
	started := false
	defer func() {
		if !started {
			f.close() // what did start
		}
	}()
	var err error
	if f.serve, f.serveURL, err = startServe(ctx, cfg.Pdplane, "pdplane serve", "--max-inflight", strconv.Itoa(maxInflight(cfg))); err != nil {
		return nil, err
	}
	f.procs = append(f.procs, f.serve)
	if f.prefill, f.decode, err = f.startEngines(ctx, cfg, spec, f.serveURL); err != nil {
		return nil, err
	}
	if err := waitStarted(ctx, f.serve, f.serveURL+"/readyz"); err != nil {
		return nil, err
	}
	if p.Name != "" {
		if err := f.startPeer(ctx, cfg, p, spec); err != nil {
			return nil, err
		}
	}
	// The first request through each router proves the whole path (a
	// router discovering its workers fails until it has).
	for _, t := range f.targets() {
		if err := sendUntilOK(ctx, f.load(t, Stream, 1), startTimeout); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", t.name, err, tail(t.proc.Output(), 4000))
		}
	}
	started = true
	return f, nil
}

// maxInflight is the cap on concurrent requests each router is given: room
// for every held stream and every client, above pdplane's default.
func maxInflight(cfg Config) int {
	return max(4096, 2*(maxOf(cfg.HeldStreams)+cfg.ProbeClients+maxOf(cfg.Concurrency)))
}

// startPeer starts the peer router in front of the fleet's engines, at its
// default log level as pdplane runs at its own, with the same cap on
// concurrent requests where its default is lower (SMG's is 1,024 a core,
// at least 4,096; vllm-router's 32,768).
func (f *fleet) startPeer(ctx context.Context, cfg Config, p Peer, spec fleetSpec) error {
	if p.Name == PeerBaseline {
		return f.startBaseline(ctx, cfg, p, spec)
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	var args []string
	switch p.Name {
	case PeerSMG:
		args, err = SMGPDArgs(p.Bin, port, "", f.prefill, f.decode)
		args = append(args, "--max-concurrent-requests", strconv.Itoa(maxInflight(cfg)))
	case PeerFloor, PeerFloorNetHTTP:
		args = FloorArgs(p.Bin, port, f.prefill, f.decode, p.Name == PeerFloorNetHTTP)
	default:
		args, err = VLLMRouterPDArgs(p.Bin, port, "", f.prefill, f.decode)
	}
	if err != nil {
		return err
	}
	if f.peer, err = Start(p.Name, nil, args...); err != nil {
		return err
	}
	f.procs = append(f.procs, f.peer)
	f.peerURL = "http://127.0.0.1:" + strconv.Itoa(port)
	return nil
}

// startServe starts bin's `serve` on a free port with args and waits until
// it answers; it stops it when it does not.
func startServe(ctx context.Context, bin, name string, args ...string) (*Process, string, error) {
	port, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	proc, err := Start(name, nil, append([]string{bin, "serve", "--addr", "127.0.0.1:" + strconv.Itoa(port)}, args...)...)
	if err != nil {
		return nil, "", err
	}
	if err := waitStarted(ctx, proc, url+"/healthz"); err != nil {
		proc.Stop()
		return nil, "", err
	}
	return proc, url, nil
}

// startEngines starts a prefill and a decode sim of the fleet's engine
// kind, registered with the serve at controlPlane.
func (f *fleet) startEngines(ctx context.Context, cfg Config, spec fleetSpec, controlPlane string) (prefill, decode *Sim, err error) {
	for _, role := range []string{"prefill", "decode"} {
		s, err := StartSim(ctx, cfg.Pdplane, SimSpec{Engine: f.engine, Role: role, ControlPlane: controlPlane,
			KVPages: spec.kvPages, CheapTransfer: spec.cheap, DecodeTimePerToken: spec.decodeTime,
			NumLayers: loadNumLayers, NumKVHeads: loadNumKVHeads, HeadDim: loadHeadDim})
		if err != nil {
			return nil, nil, err
		}
		f.procs = append(f.procs, s.Process)
		if role == "prefill" {
			prefill = s
		} else {
			decode = s
		}
	}
	return prefill, decode, nil
}

// startBaseline starts the baseline's serve and engines of its own, made
// as pdplane's are: a serve routes only the engines registered with it.
func (f *fleet) startBaseline(ctx context.Context, cfg Config, p Peer, spec fleetSpec) error {
	proc, url, err := startServe(ctx, p.Bin, "baseline serve", "--max-inflight", strconv.Itoa(maxInflight(cfg)))
	if err != nil {
		return err
	}
	f.procs = append(f.procs, proc)
	prefill, decode, err := f.startEngines(ctx, cfg, spec, url)
	if err != nil {
		return err
	}
	f.peerEngines = []*Sim{prefill, decode}
	if err := waitStarted(ctx, proc, url+"/readyz"); err != nil {
		return err
	}
	f.peer, f.peerURL = proc, url
	return nil
}

// targets are the routers in the order their windows alternate.
func (f *fleet) targets() []target {
	ts := []target{{name: "pdplane", proc: f.serve, url: f.serveURL, engines: []*Sim{f.prefill, f.decode}}}
	if f.peer != nil {
		engines := f.peerEngines
		if engines == nil {
			engines = ts[0].engines
		}
		ts = append(ts, target{name: f.peer.Name, proc: f.peer, url: f.peerURL, engines: engines})
	}
	return ts
}

// load is the request sent through t: an OpenAI chat completion, which
// every router and engine here serves.
func (f *fleet) load(t target, mode Mode, maxTokens int) Load {
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hello there, how are you"}],"max_tokens":` +
		strconv.Itoa(maxTokens)
	if mode == Stream {
		body += `,"stream":true`
	}
	return Load{URL: t.url + "/v1/chat/completions", Body: []byte(body + "}"), Stream: mode == Stream}
}

// measure runs cfg.Rounds windows of mode at conc clients through each
// router in turn.
func (f *fleet) measure(ctx context.Context, cfg Config, mode Mode, conc int) (Row, error) {
	ts := f.targets()
	stats := make([]Stats, len(ts))
	ttfts := make([][]time.Duration, len(ts))
	for round := range cfg.Rounds {
		for k := range ts {
			// Odd rounds run the routers in reverse order (pdplane, peer,
			// peer, pdplane, ...): the host's speed drifts during a run,
			// and a drift that favours whichever runs second cancels out
			// over each pair of rounds.
			i := k
			if round%2 == 1 {
				i = len(ts) - 1 - k
			}
			t := ts[i]
			before, err := ReadUsage(t.proc.PID())
			if err != nil {
				return Row{}, fmt.Errorf("%s: %w", t.name, err)
			}
			enginesBefore, err := t.engineCPU()
			if err != nil {
				return Row{}, err
			}
			start := time.Now()
			res := runWindow(ctx, f.load(t, mode, cfg.MaxTokens), conc, cfg.Window)
			elapsed := time.Since(start)
			after, err := ReadUsage(t.proc.PID())
			if err != nil {
				return Row{}, fmt.Errorf("%s: %w", t.name, err)
			}
			enginesAfter, err := t.engineCPU()
			if err != nil {
				return Row{}, err
			}
			if err := ctx.Err(); err != nil {
				return Row{}, err
			}
			s := &stats[i]
			s.Requests += res.OK
			s.Failed += res.Failed
			if s.FirstError == "" {
				s.FirstError = res.FirstError
			}
			s.Elapsed += elapsed
			s.CPU += after.CPU - before.CPU
			s.EngineCPU += enginesAfter - enginesBefore
			ttfts[i] = append(ttfts[i], res.TTFT...)
			fmt.Fprintf(f.progress, "bench: %s %s c=%d round %d: %d ok, %d failed, %.0f req/s, CPU %v\n",
				t.name, mode, conc, round+1, res.OK, res.Failed, float64(res.OK)/elapsed.Seconds(), after.CPU-before.CPU)
		}
	}
	for i := range ts {
		stats[i].TTFT50 = percentile(ttfts[i], 50)
		stats[i].TTFT99 = percentile(ttfts[i], 99)
	}
	row := Row{Mode: mode, Concurrency: conc, Pdplane: stats[0]}
	if len(ts) > 1 {
		row.Peer = &stats[1]
	}
	return row, nil
}

// close stops every process of the fleet, newest first. It is idempotent.
func (f *fleet) close() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		f.procs[i].Stop()
	}
	f.procs = nil
}

func maxOf(ns []int) int {
	m := 0
	for _, n := range ns {
		m = max(m, n)
	}
	return m
}
