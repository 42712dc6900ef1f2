package tcp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// Config configures a Backend.
type Config struct {
	// AgentName is this agent's name; required. A re-registered agent takes
	// a fresh name.
	AgentName string
	// ListenAddr is where the agent accepts transfers; default
	// "127.0.0.1:0" (a free loopback port).
	ListenAddr string
	// AdvertiseAddr is the address put in the metadata; default the
	// listener's address.
	AdvertiseAddr string
	// DialTimeout bounds connecting to a remote agent; default 5s.
	DialTimeout time.Duration
	// IOTimeout bounds connection I/O: a transfer gets at least half of it
	// to complete, and an idle connection is closed after at most all of
	// it; default 60s.
	IOTimeout time.Duration
	// MaxIdleConns is the number of idle connections kept per remote agent;
	// default 4.
	MaxIdleConns int
	// HandshakeTimeout bounds an incoming connection's hello and proof: a
	// connection that has not proved it holds the secret by then is
	// closed. The handshake is two round trips and two HMACs; default 5s.
	HandshakeTimeout time.Duration
	// MaxHandshakes caps the incoming connections still in their
	// handshake; one accepted beyond it is closed at once, before anything
	// is read or allocated for it. Initiators open at most MaxIdleConns
	// connections to an agent at a time, so a fleet of a hundred prefills
	// has a few hundred in flight at its worst moment (all starting
	// together), each for a round trip; default 256.
	MaxHandshakes int
	// Secret is this agent's transfer secret (16 to 64 bytes): every
	// incoming connection must prove it holds it (an HMAC challenge-response,
	// see wire.go). Empty draws a random 32-byte one (Backend.Secret returns
	// it), to be registered with the control plane for this agent name.
	Secret []byte
	// RemoteSecret returns a remote agent's transfer secret, from the
	// control plane over an authenticated call. It is asked once per remote
	// agent (so once per generation) before the first connection; an error
	// is not remembered. Nil refuses every outgoing connection.
	RemoteSecret func(ctx context.Context, agent string) ([]byte, error)
}

// WithDefaults returns the config with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.IOTimeout <= 0 {
		c.IOTimeout = 60 * time.Second
	}
	if c.MaxIdleConns <= 0 {
		c.MaxIdleConns = 4
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = 256
	}
	return c
}

func (c Config) validate() error {
	if c.AgentName == "" {
		return errors.New("tcp backend config: agent_name is required")
	}
	if len(c.AgentName) > maxName {
		return fmt.Errorf("tcp backend config: agent_name is longer than %d bytes", maxName)
	}
	if n := len(c.Secret); n < registry.MinTransferSecret || n > registry.MaxTransferSecret {
		return fmt.Errorf("tcp backend config: secret must be %d to %d bytes, got %d", registry.MinTransferSecret, registry.MaxTransferSecret, n)
	}
	return nil
}

// Backend is the pure-Go transfer backend: each agent listens on TCP, and a
// transfer is one framed request on a pooled connection to the remote agent,
// whose bytes go straight between the socket and registered host memory.
// Only DRAM can be registered. It implements transfer.Backend.
type Backend struct {
	cfg      Config
	log      zerolog.Logger
	instance uint64
	ln       net.Listener
	addr     string
	mem      transfer.RegionGuard

	mu      sync.Mutex
	closed  bool
	remotes map[string]*remote
	conns   map[net.Conn]struct{} // every open connection, both directions
	notifs  []transfer.Notif
	// handshakes counts the incoming connections in their handshake
	// (Config.MaxHandshakes).
	handshakes int

	wg sync.WaitGroup
}

type remote struct {
	md      metadata
	regions transfer.RegionSet
	idle    []*conn
	secret  []byte // the remote's transfer secret, once RemoteSecret gave it
}

// conn is an outgoing connection that has passed the hello.
type conn struct {
	c        net.Conn
	br       *bufio.Reader
	deadline time.Time // the connection's I/O deadline, renewed lazily
	lastUsed time.Time
}

// renew pushes the I/O deadline to now+timeout when less than half of it
// is left, so that most transfers do not touch the runtime's timers.
func renew(c net.Conn, deadline *time.Time, timeout time.Duration) {
	now := time.Now()
	if deadline.Sub(now) < timeout/2 {
		*deadline = now.Add(timeout)
		c.SetDeadline(*deadline)
	}
}

var _ transfer.Backend = (*Backend)(nil)

// New starts a backend listening on cfg.ListenAddr.
func New(cfg Config, log zerolog.Logger) (*Backend, error) {
	cfg = cfg.WithDefaults()
	if len(cfg.Secret) == 0 {
		cfg.Secret = make([]byte, 32)
		if _, err := rand.Read(cfg.Secret); err != nil {
			return nil, fmt.Errorf("tcp backend secret: %w", err)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("tcp backend listen on %s: %w", cfg.ListenAddr, err)
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		ln.Close()
		return nil, fmt.Errorf("tcp backend instance id: %w", err)
	}
	b := &Backend{
		cfg:      cfg,
		log:      log.With().Str(transfer.LogComponent, "transfer.tcp").Str(transfer.LogAgent, cfg.AgentName).Logger(),
		instance: binary.LittleEndian.Uint64(nonce[:]),
		ln:       ln,
		addr:     cfg.AdvertiseAddr,
		remotes:  make(map[string]*remote),
		conns:    make(map[net.Conn]struct{}),
	}
	if b.addr == "" {
		b.addr = ln.Addr().String()
	}
	b.wg.Add(1)
	go b.accept()
	return b, nil
}

// AgentName returns the agent's name.
func (b *Backend) AgentName() string { return b.cfg.AgentName }

// Addr returns the address remote agents dial.
func (b *Backend) Addr() string { return b.addr }

// Secret returns the agent's transfer secret, which initiators must prove
// they hold; the agent registers it with the control plane.
func (b *Backend) Secret() []byte { return bytes.Clone(b.cfg.Secret) }

// RegisterMemory registers DRAM regions.
func (b *Backend) RegisterMemory(l transfer.DescList) error {
	if l.Kind != registry.DRAM {
		return fmt.Errorf("register %s on the tcp backend: %w", l.Kind, transfer.ErrUnsupportedKind)
	}
	if err := b.checkOpen(); err != nil {
		return err
	}
	if err := b.mem.Register(l); err != nil {
		return fmt.Errorf("register memory: %w", err)
	}
	return nil
}

// DeregisterMemory deregisters regions, waiting for transfers that use
// memory to finish.
func (b *Backend) DeregisterMemory(l transfer.DescList) error {
	if err := b.mem.Deregister(l); err != nil {
		return fmt.Errorf("deregister memory: %w", err)
	}
	return nil
}

// LocalMetadata returns the agent's name, address, instance and registered
// regions.
func (b *Backend) LocalMetadata() ([]byte, error) {
	if err := b.checkOpen(); err != nil {
		return nil, err
	}
	return encodeMetadata(metadata{Name: b.cfg.AgentName, Addr: b.addr, Instance: b.instance, Regions: b.mem.Snapshot()}), nil
}

// LoadRemoteMetadata loads (or replaces) a remote agent's metadata.
func (b *Backend) LoadRemoteMetadata(md []byte) (string, error) {
	m, err := decodeMetadata(md)
	if err != nil {
		return "", err
	}
	if m.Name == b.cfg.AgentName {
		return "", fmt.Errorf("load remote metadata: it is this agent's own: %w", transfer.ErrStranger)
	}
	r := &remote{md: m}
	for _, l := range m.Regions {
		if err := r.regions.Add(l); err != nil {
			return "", fmt.Errorf("remote %s regions: %w: %w", m.Name, err, transfer.ErrBadMetadata)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return "", fmt.Errorf("tcp backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
	}
	if old, ok := b.remotes[m.Name]; ok {
		b.closeIdleLocked(old)
	}
	b.remotes[m.Name] = r
	return m.Name, nil
}

// InvalidateRemote forgets a remote agent and closes its idle connections.
func (b *Backend) InvalidateRemote(agent string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.remotes[agent]
	if !ok {
		return fmt.Errorf("invalidate %q: %w", agent, transfer.ErrUnknownAgent)
	}
	b.closeIdleLocked(r)
	delete(b.remotes, agent)
	return nil
}

func (b *Backend) closeIdleLocked(r *remote) {
	for _, c := range r.idle {
		c.c.Close()
		delete(b.conns, c.c)
	}
	r.idle = nil
}

// Post starts a transfer on a pooled connection, on its own goroutine.
func (b *Backend) Post(ctx context.Context, x transfer.Xfer) (transfer.Request, error) {
	o, err := b.begin(ctx, x)
	if err != nil {
		return nil, err
	}
	req := &request{done: make(chan struct{}), c: o.c}
	go func() {
		defer close(req.done)
		req.err = o.exec()
	}()
	return req, nil
}

// Do runs a transfer on the calling goroutine (transfer.Do uses it): no
// goroutine hand-off, which matters for small transfers. If ctx ends first
// the connection is closed, which stops the transfer.
func (b *Backend) Do(ctx context.Context, x transfer.Xfer) error {
	o, err := b.begin(ctx, x)
	if err != nil {
		return err
	}
	if ctx.Done() == nil {
		return o.exec()
	}
	stop := context.AfterFunc(ctx, func() { o.c.c.Close() })
	err = o.exec()
	if !stop() && err != nil {
		return fmt.Errorf("transfer: %w: %w", ctx.Err(), err)
	}
	return err
}

// op is a transfer that holds a connection, its local memory and a place
// in the backend's wait group until exec returns.
type op struct {
	b   *Backend
	x   transfer.Xfer
	r   *remote
	c   *conn
	acc transfer.Access
}

// begin checks x, takes (or dials) a connection and acquires local memory.
func (b *Backend) begin(ctx context.Context, x transfer.Xfer) (*op, error) {
	if err := transfer.CheckXfer(x); err != nil {
		return nil, err
	}
	if x.Local.Kind != registry.DRAM || x.Dst.Kind != registry.DRAM {
		return nil, fmt.Errorf("%s to %s on the tcp backend: %w", x.Local.Kind, x.Dst.Kind, transfer.ErrUnsupportedKind)
	}
	if len(x.Notif) > maxNotif {
		return nil, fmt.Errorf("notification of %d bytes: %w", len(x.Notif), transfer.ErrInvalidDescs)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("tcp backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
	}
	r, ok := b.remotes[x.Remote]
	if !ok {
		b.mu.Unlock()
		return nil, fmt.Errorf("transfer to %q: %w", x.Remote, transfer.ErrUnknownAgent)
	}
	if err := r.regions.Contains(x.Dst); err != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("remote %s: %w", x.Remote, err)
	}
	c := b.takeIdleLocked(r)
	md := r.md
	secret := r.secret
	b.mu.Unlock()

	acc, err := b.mem.Acquire(x.Local)
	if err != nil {
		if c != nil {
			b.putConn(x.Remote, r, c)
		}
		return nil, fmt.Errorf("local: %w", err)
	}
	if c == nil {
		if secret == nil {
			if secret, err = b.remoteSecret(ctx, r); err != nil {
				b.mem.Release(acc)
				return nil, err
			}
		}
		if c, err = b.dial(ctx, md, secret); err != nil {
			b.mem.Release(acc)
			return nil, err
		}
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.mem.Release(acc)
		b.dropConn(c)
		return nil, fmt.Errorf("tcp backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
	}
	b.wg.Add(1)
	b.mu.Unlock()
	return &op{b: b, x: x, r: r, c: c, acc: acc}, nil
}

// exec runs the transfer and gives everything back.
func (o *op) exec() error {
	defer o.b.wg.Done()
	err := o.b.run(o.c, o.x)
	o.b.mem.Release(o.acc)
	if err == nil || errors.Is(err, transfer.ErrOutOfRange) || errors.Is(err, transfer.ErrInvalidDescs) {
		o.b.putConn(o.x.Remote, o.r, o.c)
	} else {
		o.b.dropConn(o.c)
	}
	return err
}

// takeIdleLocked pops the most recently used idle connection that is
// surely still open on the remote side (see conn.lastUsed).
func (b *Backend) takeIdleLocked(r *remote) *conn {
	for n := len(r.idle); n > 0; n = len(r.idle) {
		c := r.idle[n-1]
		r.idle = r.idle[:n-1]
		if time.Since(c.lastUsed) < b.cfg.IOTimeout/4 {
			return c
		}
		c.c.Close()
		delete(b.conns, c.c)
	}
	return nil
}

// request is a posted transfer running on its own goroutine.
type request struct {
	done chan struct{}
	c    *conn
	err  error
}

// Wait waits for the transfer; if ctx ends first the connection is closed,
// which stops the transfer, and Wait returns once no memory is in use.
func (r *request) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.c.c.Close()
		<-r.done
		if r.err == nil {
			return nil
		}
		return fmt.Errorf("transfer: %w: %w", ctx.Err(), r.err)
	}
}

func (b *Backend) putConn(name string, r *remote, c *conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.remotes[name] != r || len(r.idle) >= b.cfg.MaxIdleConns {
		c.c.Close()
		delete(b.conns, c.c)
		return
	}
	c.lastUsed = time.Now()
	r.idle = append(r.idle, c)
}

func (b *Backend) dropConn(c *conn) {
	c.c.Close()
	b.mu.Lock()
	delete(b.conns, c.c)
	b.mu.Unlock()
}

// remoteSecret asks RemoteSecret for r's secret and keeps it for the next
// connections to the same agent.
func (b *Backend) remoteSecret(ctx context.Context, r *remote) ([]byte, error) {
	if b.cfg.RemoteSecret == nil {
		return nil, fmt.Errorf("connect to %s: no way to learn remote transfer secrets: %w", r.md.Name, transfer.ErrUnauthenticated)
	}
	secret, err := b.cfg.RemoteSecret(ctx, r.md.Name)
	if err != nil {
		return nil, fmt.Errorf("transfer secret of %s: %w: %w", r.md.Name, transfer.ErrUnauthenticated, err)
	}
	if len(secret) == 0 {
		return nil, fmt.Errorf("transfer secret of %s is empty: %w", r.md.Name, transfer.ErrUnauthenticated)
	}
	b.mu.Lock()
	r.secret = bytes.Clone(secret)
	b.mu.Unlock()
	return secret, nil
}

// dial connects to the remote agent and runs the handshake: the remote
// proves it holds secret before any byte of ours goes to it, then we prove
// it too.
func (b *Backend) dial(ctx context.Context, md metadata, secret []byte) (*conn, error) {
	d := net.Dialer{Timeout: b.cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", md.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s at %s: %w: %w", md.Name, md.Addr, transfer.ErrPeerGone, err)
	}
	if !b.track(nc) {
		return nil, fmt.Errorf("tcp backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
	}
	c := &conn{c: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	fail := func(what string, class, err error) (*conn, error) {
		b.dropConn(c)
		if err == nil {
			return nil, fmt.Errorf("%s %s: %w", what, md.Name, class)
		}
		return nil, fmt.Errorf("%s %s: %w: %w", what, md.Name, class, err)
	}
	// The handshake ends by the dial timeout or the caller's deadline,
	// whichever comes first: a peer that accepts and never answers must not
	// hold a short-deadline caller (a preflight) for the whole timeout.
	handshake := time.Now().Add(b.cfg.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(handshake) {
		handshake = d
	}
	nc.SetDeadline(handshake)
	h := hello{Initiator: b.cfg.AgentName, Target: md.Name, Instance: md.Instance}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return fail("hello to", transfer.ErrPeerGone, err)
	}
	if _, err := nc.Write(encodeHello(h)); err != nil {
		return fail("hello to", transfer.ErrPeerGone, err)
	}
	st, msg, err := readReply(c.br)
	if err != nil {
		return fail("hello to", transfer.ErrPeerGone, err)
	}
	if err := statusErr(st, msg); err != nil {
		b.dropConn(c)
		return nil, fmt.Errorf("hello to %s: %w", md.Name, err)
	}
	var challenge [nonceBytes + proofBytes]byte
	if _, err := io.ReadFull(c.br, challenge[:]); err != nil {
		return fail("challenge from", transfer.ErrPeerGone, err)
	}
	targetNonce := [nonceBytes]byte(challenge[:nonceBytes])
	want := proof(secret, roleTarget, h, targetNonce)
	if !hmac.Equal(challenge[nonceBytes:], want[:]) {
		return fail("the remote did not prove it holds the transfer secret of", transfer.ErrUnauthenticated, nil)
	}
	mine := proof(secret, roleInitiator, h, targetNonce)
	if _, err := nc.Write(mine[:]); err != nil {
		return fail("proof to", transfer.ErrPeerGone, err)
	}
	if st, msg, err = readReply(c.br); err != nil {
		return fail("proof to", transfer.ErrPeerGone, err)
	}
	if err := statusErr(st, msg); err != nil {
		b.dropConn(c)
		return nil, fmt.Errorf("proof to %s: %w", md.Name, err)
	}
	c.deadline = time.Now().Add(b.cfg.DialTimeout)
	return c, nil
}

func (b *Backend) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		c.Close()
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

// run performs one transfer on c: one request, or, when it has more spans
// than a request may carry (maxSpans), several in a row on c, the
// notification on the last, so that the target has every byte in place
// (or sent) before it queues it.
func (b *Backend) run(c *conn, x transfer.Xfer) error {
	for len(x.Dst.Descs) > maxSpans {
		part := x
		part.Dst.Descs, x.Dst.Descs = x.Dst.Descs[:maxSpans], x.Dst.Descs[maxSpans:]
		part.Local.Descs, x.Local.Descs = x.Local.Descs[:maxSpans], x.Local.Descs[maxSpans:] // pairwise (transfer.Xfer)
		part.Notif = nil
		if err := b.runOne(c, part); err != nil {
			return err
		}
	}
	return b.runOne(c, x)
}

// runOne performs one request on c.
func (b *Backend) runOne(c *conn, x transfer.Xfer) error {
	h := header{Op: x.Op, HasNotif: x.Notif != nil, Spans: uint32(len(x.Dst.Descs)), NotifLen: uint32(len(x.Notif)), Total: x.Dst.Bytes()}
	hdr := make([]byte, headerBytes+spanBytes*len(x.Dst.Descs), headerBytes+spanBytes*len(x.Dst.Descs)+len(x.Notif))
	putHeader(hdr, h)
	for i, d := range x.Dst.Descs {
		binary.LittleEndian.PutUint64(hdr[headerBytes+i*spanBytes:], d.Addr)
		binary.LittleEndian.PutUint64(hdr[headerBytes+i*spanBytes+8:], d.Len)
	}
	hdr = append(hdr, x.Notif...)
	renew(c.c, &c.deadline, b.cfg.IOTimeout)
	bufs := net.Buffers{hdr}
	if x.Op == transfer.OpWrite {
		for _, d := range x.Local.Descs {
			bufs = append(bufs, transfer.HostBytes(d.Addr, d.Len))
		}
	}
	if _, err := bufs.WriteTo(c.c); err != nil {
		return fmt.Errorf("%s to %s: %w: %w", x.Op, x.Remote, transfer.ErrPeerGone, err)
	}
	st, msg, err := readReply(c.br)
	if err != nil {
		return fmt.Errorf("%s to %s: %w: %w", x.Op, x.Remote, transfer.ErrPeerGone, err)
	}
	if err := statusErr(st, msg); err != nil {
		return fmt.Errorf("%s to %s: %w", x.Op, x.Remote, err)
	}
	if x.Op == transfer.OpRead {
		for _, d := range x.Local.Descs {
			if _, err := io.ReadFull(c.br, transfer.HostBytes(d.Addr, d.Len)); err != nil {
				return fmt.Errorf("READ from %s: %w: %w", x.Remote, transfer.ErrPeerGone, err)
			}
		}
	}
	return nil
}

// Prepare checks both lists once; transfers then pick spans by index.
func (b *Backend) Prepare(remoteName string, local, dst transfer.DescList) (transfer.Prepared, error) {
	if local.Kind != registry.DRAM || dst.Kind != registry.DRAM {
		return nil, fmt.Errorf("%s to %s on the tcp backend: %w", local.Kind, dst.Kind, transfer.ErrUnsupportedKind)
	}
	if err := b.mem.Contains(local); err != nil {
		return nil, fmt.Errorf("prepare local list: %w", err)
	}
	b.mu.Lock()
	r, ok := b.remotes[remoteName]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("prepare for %q: %w", remoteName, transfer.ErrUnknownAgent)
	}
	if err := r.regions.Contains(dst); err != nil {
		return nil, fmt.Errorf("prepare remote list for %s: %w", remoteName, err)
	}
	return &prepared{b: b, remote: remoteName, r: r, local: local, dst: dst}, nil
}

type prepared struct {
	b          *Backend
	remote     string
	r          *remote
	local, dst transfer.DescList
	mu         sync.Mutex
	released   bool
}

// Post selects spans by index and posts them as one transfer.
func (p *prepared) Post(ctx context.Context, op transfer.Op, localIdx, remoteIdx []int, notif []byte) (transfer.Request, error) {
	p.mu.Lock()
	released := p.released
	p.mu.Unlock()
	if released {
		return nil, fmt.Errorf("prepared lists for %s: %w", p.remote, transfer.ErrClosed)
	}
	p.b.mu.Lock()
	current := p.b.remotes[p.remote] == p.r
	p.b.mu.Unlock()
	if !current {
		return nil, fmt.Errorf("prepared lists for %s outlived its metadata: %w", p.remote, transfer.ErrUnknownAgent)
	}
	l, d, err := transfer.SelectPairs(p.local, p.dst, localIdx, remoteIdx)
	if err != nil {
		return nil, err
	}
	return p.b.Post(ctx, transfer.Xfer{Op: op, Remote: p.remote, Local: l, Dst: d, Notif: notif})
}

// Release marks the lists released.
func (p *prepared) Release() error {
	p.mu.Lock()
	p.released = true
	p.mu.Unlock()
	return nil
}

// GetNotifs drains received notifications.
func (b *Backend) GetNotifs() ([]transfer.Notif, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("tcp backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
	}
	n := b.notifs
	b.notifs = nil
	return n, nil
}

// Close stops listening, closes every connection (failing transfers in
// flight), waits for its goroutines and forgets all registrations.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	err := b.ln.Close()
	for c := range b.conns {
		c.Close()
	}
	b.conns = map[net.Conn]struct{}{}
	b.remotes = map[string]*remote{}
	b.mu.Unlock()
	b.wg.Wait()
	b.mem.DeregisterAll()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close listener: %w", err)
	}
	return nil
}

func (b *Backend) checkOpen() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("tcp backend %s: %w", b.cfg.AgentName, transfer.ErrClosed)
	}
	return nil
}

func (b *Backend) accept() {
	defer b.wg.Done()
	for {
		nc, err := b.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				b.log.Warn().Err(err).Msg("accept")
			}
			return
		}
		if !b.beginHandshake() {
			// Over the cap: closed before a goroutine or a buffer is spent
			// on it. The initiator sees ErrPeerGone and retries.
			b.log.Debug().Str(transfer.LogRemoteAddr, nc.RemoteAddr().String()).Int("handshakes", b.cfg.MaxHandshakes).
				Msg("refused a connection: too many in their handshake")
			nc.Close()
			continue
		}
		if !b.track(nc) {
			b.endHandshake()
			return
		}
		b.wg.Add(1)
		go b.serve(nc)
	}
}

// beginHandshake counts an incoming connection into its handshake; false
// when MaxHandshakes are already in theirs.
func (b *Backend) beginHandshake() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.handshakes >= b.cfg.MaxHandshakes {
		return false
	}
	b.handshakes++
	return true
}

func (b *Backend) endHandshake() {
	b.mu.Lock()
	b.handshakes--
	b.mu.Unlock()
}

// handshakeBuf is the read buffer of a connection in its handshake: a
// hello is at most some 2 KiB. The large buffer of the transfers comes
// only after the proof.
const handshakeBuf = 4 << 10

// serve answers one incoming connection: the handshake, then requests
// until the connection closes.
func (b *Backend) serve(nc net.Conn) {
	defer b.wg.Done()
	defer b.dropConn(&conn{c: nc})
	hs, initiator, ok := b.handshake(nc)
	b.endHandshake()
	if !ok {
		return
	}
	b.serveRequests(nc, hs, initiator)
}

// handshake reads the hello and checks the initiator's proof, all within
// HandshakeTimeout; ok is false when the connection is to be closed.
func (b *Backend) handshake(nc net.Conn) (hs *bufio.Reader, initiator string, ok bool) {
	nc.SetDeadline(time.Now().Add(b.cfg.HandshakeTimeout))
	br := bufio.NewReaderSize(nc, handshakeBuf)
	h, err := readHello(br)
	if err != nil {
		b.log.Debug().Err(err).Str(transfer.LogRemoteAddr, nc.RemoteAddr().String()).Msg("bad hello")
		return nil, "", false
	}
	if h.Target != b.cfg.AgentName || h.Instance != b.instance {
		b.log.Info().Str(transfer.LogInitiator, h.Initiator).Str(transfer.LogTarget, h.Target).Msg("hello for another agent or instance")
		nc.Write(appendReply(nil, stStranger, fmt.Sprintf("this is agent %s, not %s at that instance", b.cfg.AgentName, h.Target)))
		return nil, "", false
	}
	// The challenge: our nonce and our proof, then the initiator's proof.
	// Nothing of the memory is reachable before it checks out.
	var targetNonce [nonceBytes]byte
	if _, err := rand.Read(targetNonce[:]); err != nil {
		return nil, "", false
	}
	mine := proof(b.cfg.Secret, roleTarget, h, targetNonce)
	challenge := appendReply(nil, stOK, "")
	challenge = append(append(challenge, targetNonce[:]...), mine[:]...)
	if _, err := nc.Write(challenge); err != nil {
		return nil, "", false
	}
	var theirs [proofBytes]byte
	if _, err := io.ReadFull(br, theirs[:]); err != nil {
		b.log.Info().Err(err).Str(transfer.LogInitiator, h.Initiator).Str(transfer.LogRemoteAddr, nc.RemoteAddr().String()).
			Msg("connection left during the handshake (an initiator without the transfer secret hangs up here)")
		return nil, "", false
	}
	if want := proof(b.cfg.Secret, roleInitiator, h, targetNonce); !hmac.Equal(theirs[:], want[:]) {
		b.log.Warn().Str(transfer.LogInitiator, h.Initiator).Str(transfer.LogRemoteAddr, nc.RemoteAddr().String()).
			Msg("refused a connection that does not hold the transfer secret")
		nc.Write(appendReply(nil, stUnauthenticated, "the connection did not prove it holds this agent's transfer secret"))
		return nil, "", false
	}
	if _, err := nc.Write(appendReply(nil, stOK, "")); err != nil {
		return nil, "", false
	}
	nc.SetDeadline(time.Time{})
	return br, h.Initiator, true
}

// serveRequests serves the requests of initiator's authenticated
// connection, read through hs (the handshake's reader, with what it
// buffered).
func (b *Backend) serveRequests(nc net.Conn, hs *bufio.Reader, initiator string) {
	br := bufio.NewReaderSize(hs, 256<<10)
	hdr := make([]byte, headerBytes)
	var reply []byte
	// The deadline bounds a stalled transfer (which holds memory that
	// deregistration waits for) and an idle connection alike; initiators
	// do not reuse connections idle for a quarter of it.
	var deadline time.Time
	for {
		renew(nc, &deadline, b.cfg.IOTimeout)
		if _, err := io.ReadFull(br, hdr); err != nil {
			return
		}
		renew(nc, &deadline, b.cfg.IOTimeout)
		req, err := parseHeader(hdr)
		if err != nil {
			nc.Write(appendReply(reply[:0], stInvalid, err.Error()))
			return
		}
		// Nothing is allocated from what the header announces: a request
		// for more bytes than are registered, or with more spans than
		// bytes, could never be served, and is refused before its spans
		// are read; the spans and the notification are then read as they
		// arrive, so that a header is no way to make this agent allocate.
		if registered := b.mem.Bytes(registry.DRAM); req.Total > registered || uint64(req.Spans) > req.Total {
			nc.Write(appendReply(reply[:0], stInvalid, fmt.Sprintf("%d spans of %d bytes in all: this agent has %d bytes registered", req.Spans, req.Total, registered)))
			return
		}
		spans, err := readSpans(br, req.Spans, req.Total)
		if err != nil {
			if errors.Is(err, errBadSpans) {
				nc.Write(appendReply(reply[:0], stInvalid, err.Error()))
			}
			return
		}
		var notif []byte
		if req.HasNotif {
			if notif, err = readUpTo(br, int(req.NotifLen)); err != nil {
				return
			}
		}
		list := transfer.DescList{Kind: registry.DRAM, Descs: spans}
		acc, accErr := b.mem.Acquire(list)
		st, msg := stOK, ""
		if accErr != nil {
			st, msg = stOutOfRange, accErr.Error()
		}
		if req.Op == transfer.OpWrite {
			if accErr != nil {
				// Keep the connection usable: swallow the payload.
				if _, err := io.CopyN(io.Discard, br, int64(req.Total)); err != nil {
					return
				}
			} else {
				for _, d := range spans {
					if _, err := io.ReadFull(br, transfer.HostBytes(d.Addr, d.Len)); err != nil {
						b.mem.Release(acc)
						return
					}
				}
				b.mem.Release(acc)
				b.deliver(initiator, notif, req.HasNotif)
			}
			reply = appendReply(reply[:0], st, msg)
			if _, err := nc.Write(reply); err != nil {
				return
			}
			continue
		}
		reply = appendReply(reply[:0], st, msg)
		if accErr != nil {
			if _, err := nc.Write(reply); err != nil {
				return
			}
			continue
		}
		bufs := net.Buffers{reply}
		for _, d := range spans {
			bufs = append(bufs, transfer.HostBytes(d.Addr, d.Len))
		}
		_, err = bufs.WriteTo(nc)
		b.mem.Release(acc)
		if err != nil {
			return
		}
		b.deliver(initiator, notif, req.HasNotif)
	}
}

func (b *Backend) deliver(from string, msg []byte, has bool) {
	if !has {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.notifs = append(b.notifs, transfer.Notif{Agent: from, Msg: append([]byte{}, msg...)})
}
