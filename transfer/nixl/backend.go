package nixl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
)

// Config configures a Backend.
type Config struct {
	// AgentName is the NIXL agent name; required. A re-registered agent
	// takes a fresh name (SGLang ignores re-registration under an old one).
	AgentName string
	// Plugin is the backend plugin; default "UCX".
	Plugin string
	// Params override the plugin's default parameters.
	Params map[string]string
	// UCXTLS, when set, restricts the UCX transports through the plugin's
	// engine_config parameter (e.g. "tcp" on a CPU-only host); it is ignored
	// for other plugins and when Params sets engine_config.
	UCXTLS string
	// Agent tunes the agent.
	Agent AgentConfig
	// PollSpin is how long a wait polls the transfer's status back to back
	// (yielding to other goroutines) before it starts sleeping between
	// polls; default 2ms. An agent without a progress thread never sleeps:
	// its polls are what progresses the transfer.
	PollSpin time.Duration
	// PollBackoff caps the sleep between status polls after PollSpin;
	// default 50µs.
	PollBackoff time.Duration
	// ReleaseGrace bounds how long a cancelled wait keeps polling a request
	// that NIXL could not abort before giving it to Close; default 10s.
	ReleaseGrace time.Duration
}

// WithDefaults returns the config with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Plugin == "" {
		c.Plugin = "UCX"
	}
	if c.PollSpin <= 0 {
		c.PollSpin = 2 * time.Millisecond
	}
	if c.PollBackoff <= 0 {
		c.PollBackoff = 50 * time.Microsecond
	}
	if c.ReleaseGrace <= 0 {
		c.ReleaseGrace = 10 * time.Second
	}
	return c
}

func (c Config) validate() error {
	if c.AgentName == "" {
		return errors.New("nixl backend config: agent_name is required")
	}
	return nil
}

func (c Config) params() map[string]string {
	p := map[string]string{}
	for k, v := range c.Params {
		p[k] = v
	}
	if _, ok := p["engine_config"]; !ok && c.UCXTLS != "" && c.Plugin == "UCX" {
		p["engine_config"] = "TLS=" + c.UCXTLS
	}
	return p
}

// Backend moves bytes through NIXL: one agent with one explicitly created
// plugin backend (UCX by default). It implements transfer.Backend and checks
// spans against the memory it registered before NIXL sees them.
type Backend struct {
	cfg     Config
	log     zerolog.Logger
	agent   *Agent
	backend *BackendHandle
	mem     transfer.RegionGuard

	mu       sync.Mutex
	closed   bool
	remotes  map[string]bool
	prepared map[*prepared]struct{}
	live     map[*request]struct{}
}

var _ transfer.Backend = (*Backend)(nil)

// New loads the library (see Load) and creates the agent and its backend.
func New(cfg Config, log zerolog.Logger) (*Backend, error) {
	lib, err := Load()
	if err != nil {
		return nil, err
	}
	return lib.NewBackend(cfg, log)
}

// NewBackend creates an agent with thread sync STRICT and one plugin
// backend.
func (l *Library) NewBackend(cfg Config, log zerolog.Logger) (*Backend, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a, err := l.NewAgent(cfg.AgentName, cfg.Agent)
	if err != nil {
		return nil, err
	}
	bh, err := a.CreateBackend(cfg.Plugin, cfg.params())
	if err != nil {
		a.Close()
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrBackend) {
			return nil, fmt.Errorf("%w (if the %s plugin is missing, set NIXL_PLUGIN_DIR to the folder holding libplugin_%s.so)", err, cfg.Plugin, cfg.Plugin)
		}
		return nil, err
	}
	return &Backend{
		cfg:      cfg,
		log:      log.With().Str(transfer.LogComponent, "transfer.nixl").Str(transfer.LogAgent, cfg.AgentName).Logger(),
		agent:    a,
		backend:  bh,
		remotes:  map[string]bool{},
		prepared: map[*prepared]struct{}{},
		live:     map[*request]struct{}{},
	}, nil
}

// Agent returns the underlying agent.
func (b *Backend) Agent() *Agent { return b.agent }

// AgentName returns the agent's name.
func (b *Backend) AgentName() string { return b.cfg.AgentName }

// OpenHandles returns the live requests and prepared lists.
func (b *Backend) OpenHandles() int { return b.agent.OpenHandles() }

func (b *Backend) checkOpen() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.errClosed()
	}
	return nil
}

// errClosed is the error of a call on a closed backend.
func (b *Backend) errClosed() error {
	return fmt.Errorf("nixl backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
}

// track adds k to set, one of b's sets of open handles that Close
// releases, unless b is closed.
func track[K comparable](b *Backend, set map[K]struct{}, k K) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.errClosed()
	}
	set[k] = struct{}{}
	return nil
}

// RegisterMemory registers regions with the plugin backend.
func (b *Backend) RegisterMemory(l transfer.DescList) error {
	if err := b.checkOpen(); err != nil {
		return err
	}
	if err := b.mem.Register(l); err != nil {
		return fmt.Errorf("register memory: %w", err)
	}
	if err := b.agent.RegisterMem(l, b.backend); err != nil {
		b.mem.Deregister(l)
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidParam) {
			return fmt.Errorf("register %s memory: %w: %w", l.Kind, transfer.ErrUnsupportedKind, err)
		}
		return fmt.Errorf("register %s memory: %w", l.Kind, err)
	}
	return nil
}

// DeregisterMemory waits for transfers using memory, then deregisters.
func (b *Backend) DeregisterMemory(l transfer.DescList) error {
	if err := b.mem.Deregister(l); err != nil {
		return fmt.Errorf("deregister memory: %w", err)
	}
	if err := b.agent.DeregisterMem(l, b.backend); err != nil {
		return fmt.Errorf("deregister %s memory: %w", l.Kind, err)
	}
	return nil
}

// LocalMetadata returns the agent's NIXL metadata.
func (b *Backend) LocalMetadata() ([]byte, error) {
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	md, err := b.agent.LocalMD()
	if err != nil {
		return nil, fmt.Errorf("local metadata: %w", err)
	}
	return md, nil
}

// LoadRemoteMetadata loads a remote agent's metadata. Loading metadata for an
// agent already loaded replaces it (and releases prepared lists for it).
func (b *Backend) LoadRemoteMetadata(md []byte) (string, error) {
	if err := b.checkOpen(); err != nil {
		return "", err
	}
	if len(md) == 0 {
		return "", fmt.Errorf("load remote metadata: empty: %w", transfer.ErrBadMetadata)
	}
	name, err := b.agent.LoadRemoteMD(md)
	if err != nil {
		return "", fmt.Errorf("load remote metadata: %w: %w", transfer.ErrBadMetadata, err)
	}
	if name == b.cfg.AgentName {
		return "", fmt.Errorf("load remote metadata: it is this agent's own: %w", transfer.ErrStranger)
	}
	b.mu.Lock()
	b.remotes[name] = true
	b.mu.Unlock()
	return name, nil
}

// InvalidateRemote releases prepared lists for the agent and forgets its
// metadata.
func (b *Backend) InvalidateRemote(agent string) error {
	b.mu.Lock()
	if !b.remotes[agent] {
		b.mu.Unlock()
		return fmt.Errorf("invalidate %q: %w", agent, transfer.ErrUnknownAgent)
	}
	delete(b.remotes, agent)
	var ps []*prepared
	for p := range b.prepared {
		if p.remote == agent {
			ps = append(ps, p)
		}
	}
	b.mu.Unlock()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Release())
	}
	if err := b.agent.InvalidateRemoteMD(agent); err != nil {
		errs = append(errs, fmt.Errorf("invalidate %s: %w", agent, err))
	}
	return errors.Join(errs...)
}

func (b *Backend) knows(agent string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.remotes[agent]
}

// checkRemote classifies remote spans NIXL's metadata does not cover.
func (b *Backend) checkRemote(agent string, dst transfer.DescList) error {
	if !b.knows(agent) {
		return fmt.Errorf("transfer to %q: %w", agent, transfer.ErrUnknownAgent)
	}
	if err := b.agent.CheckRemoteMD(agent, &dst); err != nil {
		if errors.Is(err, errClosed) {
			return b.errClosed()
		}
		return fmt.Errorf("remote %s spans: %w: %w", agent, transfer.ErrOutOfRange, err)
	}
	return nil
}

// Post creates a request from the two lists (the simple xfer-dlist path),
// posts it and returns without waiting.
func (b *Backend) Post(ctx context.Context, x transfer.Xfer) (transfer.Request, error) {
	if err := transfer.CheckXfer(x); err != nil {
		return nil, err
	}
	b.mu.Lock()
	closed, known := b.closed, b.remotes[x.Remote]
	b.mu.Unlock()
	if closed {
		return nil, b.errClosed()
	}
	if !known {
		return nil, fmt.Errorf("transfer to %q: %w", x.Remote, transfer.ErrUnknownAgent)
	}
	acc, err := b.mem.Acquire(x.Local)
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	req, err := b.agent.CreateXferReq(x.Op, x.Local, x.Dst, x.Remote, x.Notif, b.backend)
	if err != nil {
		b.mem.Release(acc)
		// Find out why only on the error path: the check costs a list.
		if cerr := b.checkRemote(x.Remote, x.Dst); cerr != nil {
			return nil, fmt.Errorf("%w (create: %w)", cerr, err)
		}
		return nil, b.classify(fmt.Sprintf("create %s to %s", x.Op, x.Remote), err)
	}
	return b.start(x.Op, x.Remote, req, acc)
}

// classify wraps a NIXL error from creating a request with the transfer
// class it means.
func (b *Backend) classify(what string, err error) error {
	switch {
	case errors.Is(err, errClosed):
		return fmt.Errorf("%s: %w", what, transfer.ErrClosed)
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%s: %w: %w", what, transfer.ErrOutOfRange, err)
	case errors.Is(err, ErrInvalidParam):
		return fmt.Errorf("%s: %w: %w", what, transfer.ErrInvalidDescs, err)
	}
	return fmt.Errorf("%s: %w: %w", what, transfer.ErrPeerGone, err)
}

// start posts req and tracks it until it is released.
func (b *Backend) start(op transfer.Op, remote string, req *XferReq, acc transfer.Access) (transfer.Request, error) {
	r := &request{b: b, x: req, acc: acc, op: op, remote: remote}
	if err := track(b, b.live, r); err != nil {
		r.finish()
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := req.Post()
	if err != nil {
		r.finish()
		return nil, b.classify(fmt.Sprintf("post %s to %s", op, remote), err)
	}
	if st == StatusSuccess {
		r.done, r.ok = true, true
	}
	return r, nil
}

// request is a posted NIXL transfer.
type request struct {
	b      *Backend
	op     transfer.Op
	remote string

	mu     sync.Mutex
	x      *XferReq
	acc    transfer.Access
	done   bool  // the transfer is no longer in progress
	ok     bool  // ... and it succeeded
	err    error // the result Wait returns
	closed bool  // released and untracked
}

// finish releases the request and its memory and untracks it. It holds
// r.mu when called from Wait; Close calls it with r.mu held too.
func (r *request) finish() {
	if r.closed {
		return
	}
	if err := r.x.Release(); err != nil && !errors.Is(err, errClosed) {
		r.b.log.Warn().Err(err).Str(transfer.LogRemote, r.remote).Msg("release transfer request")
		return
	}
	r.closed = true
	r.b.mem.Release(r.acc)
	r.b.mu.Lock()
	delete(r.b.live, r)
	r.b.mu.Unlock()
}

// Wait polls until the transfer is no longer in progress, then releases it.
// If ctx ends first, the request is released (NIXL aborts it where it can);
// if NIXL cannot yet, it is polled for up to ReleaseGrace and otherwise left
// for Close.
func (r *request) Wait(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.err
	}
	var spinUntil time.Time
	spinning := true
	sleep := time.Microsecond
	for i := 0; !r.done; i++ {
		st, err := r.x.Status()
		if err != nil {
			r.done, r.err = true, r.b.classify(fmt.Sprintf("%s to %s", r.op, r.remote), err)
			break
		}
		if st == StatusSuccess {
			r.done, r.ok = true, true
			break
		}
		if ctx.Err() != nil {
			r.err = fmt.Errorf("%s to %s: %w", r.op, r.remote, ctx.Err())
			r.abandon()
			return r.err
		}
		if spinning {
			switch {
			case i == 0:
				spinUntil = time.Now().Add(r.b.cfg.PollSpin)
			case i%64 == 0:
				// Without a progress thread the polls are what moves
				// the bytes: never sleep between them.
				spinning = r.b.cfg.Agent.NoProgressThread || time.Now().Before(spinUntil)
			}
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, r.b.cfg.PollBackoff)
	}
	r.finish()
	return r.err
}

// abandon releases a request whose waiter gave up.
func (r *request) abandon() {
	if err := r.x.Release(); err == nil || errors.Is(err, errClosed) {
		r.closed = true
		r.b.mem.Release(r.acc)
		r.b.mu.Lock()
		delete(r.b.live, r)
		r.b.mu.Unlock()
		return
	}
	deadline := time.Now().Add(r.b.cfg.ReleaseGrace)
	for time.Now().Before(deadline) {
		st, err := r.x.Status()
		if err != nil || st != StatusInProgress {
			r.done = true
			r.finish()
			return
		}
		time.Sleep(time.Millisecond)
	}
	// Still running: Close will wait for it.
}

// Prepare prepares the local list ("" agent) and the remote list once;
// transfers then pick spans by index (prepared dlists + make_xfer_req).
func (b *Backend) Prepare(remote string, local, dst transfer.DescList) (transfer.Prepared, error) {
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	if err := b.mem.Contains(local); err != nil {
		return nil, fmt.Errorf("prepare local list: %w", err)
	}
	if err := b.checkRemote(remote, dst); err != nil {
		return nil, err
	}
	lh, err := b.agent.PrepXferDlist("", local, b.backend)
	if err != nil {
		return nil, b.classify("prepare local list", err)
	}
	rh, err := b.agent.PrepXferDlist(remote, dst, b.backend)
	if err != nil {
		lh.Release()
		return nil, b.classify("prepare list of "+remote, err)
	}
	p := &prepared{b: b, remote: remote, local: local, dst: dst, lh: lh, rh: rh}
	if err := track(b, b.prepared, p); err != nil {
		p.Release()
		return nil, err
	}
	return p, nil
}

type prepared struct {
	b          *Backend
	remote     string
	local, dst transfer.DescList

	mu       sync.Mutex
	lh, rh   *PreppedDlist
	released bool
}

// Post makes a request from the prepared lists and posts it.
func (p *prepared) Post(ctx context.Context, op transfer.Op, localIdx, remoteIdx []int, notif []byte) (transfer.Request, error) {
	if op != transfer.OpRead && op != transfer.OpWrite {
		return nil, fmt.Errorf("transfer op %d: %w", int(op), transfer.ErrInvalidDescs)
	}
	// Selecting checks the indices and lengths; the merged lists are what
	// the request touches locally.
	local, _, err := transfer.SelectPairs(p.local, p.dst, localIdx, remoteIdx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return nil, fmt.Errorf("prepared lists for %s are released: %w", p.remote, transfer.ErrUnknownAgent)
	}
	acc, err := p.b.mem.Acquire(local)
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	req, err := p.b.agent.MakeXferReq(op, p.lh, localIdx, p.rh, remoteIdx, notif, p.b.backend)
	if err != nil {
		p.b.mem.Release(acc)
		return nil, p.b.classify(fmt.Sprintf("make %s to %s", op, p.remote), err)
	}
	return p.b.start(op, p.remote, req, acc)
}

// Release releases both prepared lists.
func (p *prepared) Release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return nil
	}
	err := errors.Join(p.lh.Release(), p.rh.Release())
	if err != nil && !errors.Is(err, errClosed) {
		return fmt.Errorf("release prepared lists for %s: %w", p.remote, err)
	}
	p.released = true
	p.b.mu.Lock()
	delete(p.b.prepared, p)
	p.b.mu.Unlock()
	return nil
}

// GetNotifs drains received notifications.
func (b *Backend) GetNotifs() ([]transfer.Notif, error) {
	ns, err := b.agent.GetNotifs()
	if err != nil {
		if errors.Is(err, errClosed) {
			return nil, b.errClosed()
		}
		return nil, fmt.Errorf("get notifications: %w", err)
	}
	return ns, nil
}

// Close releases, in order: requests in flight (waiting for them, then
// releasing), prepared lists, memory registrations, remote metadata, the
// plugin backend and the agent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	live := make([]*request, 0, len(b.live))
	for r := range b.live {
		live = append(live, r)
	}
	ps := make([]*prepared, 0, len(b.prepared))
	for p := range b.prepared {
		ps = append(ps, p)
	}
	remotes := make([]string, 0, len(b.remotes))
	for n := range b.remotes {
		remotes = append(remotes, n)
	}
	b.remotes = map[string]bool{}
	b.mu.Unlock()

	var errs []error
	for _, r := range live {
		r.mu.Lock()
		deadline := time.Now().Add(b.cfg.ReleaseGrace)
		for !r.closed && time.Now().Before(deadline) {
			if err := r.x.Release(); err == nil {
				r.closed = true
				b.mem.Release(r.acc)
				break
			}
			time.Sleep(time.Millisecond)
		}
		if !r.closed {
			errs = append(errs, fmt.Errorf("transfer request to %s still in progress at close", r.remote))
			b.mem.Release(r.acc)
			r.closed = true
		}
		if r.err == nil && !r.ok {
			r.err = fmt.Errorf("%s to %s: %w", r.op, r.remote, transfer.ErrClosed)
		}
		r.mu.Unlock()
	}
	for _, p := range ps {
		if err := p.Release(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range b.mem.DeregisterAll() {
		if err := b.agent.DeregisterMem(l, b.backend); err != nil {
			errs = append(errs, fmt.Errorf("deregister %s memory: %w", l.Kind, err))
		}
	}
	for _, n := range remotes {
		if err := b.agent.InvalidateRemoteMD(n); err != nil {
			b.log.Debug().Err(err).Str(transfer.LogRemote, n).Msg("invalidate at close")
		}
	}
	if err := b.agent.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
