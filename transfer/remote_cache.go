package transfer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/rs/zerolog"
)

// Peer is what the control plane says about one destination rank: a stable
// key across re-registrations, and the current agent name, generation,
// metadata and geometry.
type Peer struct {
	// Key identifies the rank across re-registrations (e.g. peer id and
	// rank); AgentName changes when the peer re-registers, Key does not.
	Key        string
	AgentName  string       // current NIXL agent name
	Generation int64        // bumped by the control plane on every re-registration
	Metadata   []byte       // the agent's metadata, as the control plane carries it
	Geometry   RankGeometry // the rank's KV regions
	AttnTPSize int          // the decode's attention TP size
	AttnTPRank int          // the rank's attention TP rank
}

// ResolveFunc resolves a destination's memory kinds for transfers from src;
// Resolve is the default. Simulators inject faults by replacing it.
type ResolveFunc func(src Source, dst RankGeometry, dstAttnTPSize, dstAttnTPRank int) (*Destination, error)

// Remote is a loaded destination: its resolved kinds, its layout and the
// prepared lists, valid for one (agent name, generation).
type Remote struct {
	AgentName  string       // the loaded agent
	Generation int64        // the loaded generation
	Dest       *Destination // resolved kinds
	Layout     *Layout      // nil when Dest is unresolved (see RemoteCache.load)
	Prepared   []Prepared   // one per Layout.Lists entry

	refs    int
	retired bool
	drained chan struct{} // closed when retired and refs drop to zero
}

// RemoteCache holds the loaded remote agents of a backend, keyed by peer
// key and generation. When a peer shows up with a newer generation (it
// re-registered under a fresh agent name), the old entry is retired: once
// the transfers using it finish, its prepared lists are released and its
// metadata invalidated, and only then are the new metadata loaded and the
// lists prepared again. It is safe for concurrent use.
type RemoteCache struct {
	b       Backend
	src     Source
	resolve ResolveFunc
	log     zerolog.Logger

	mu     sync.Mutex
	slots  map[string]*slot
	closed bool
}

type slot struct {
	mu  sync.Mutex // held while loading or evicting
	cur *Remote
}

// NewRemoteCache returns an empty cache over b for transfers from src.
// resolve may be nil (Resolve).
func NewRemoteCache(b Backend, src Source, resolve ResolveFunc, log zerolog.Logger) *RemoteCache {
	if resolve == nil {
		resolve = Resolve
	}
	return &RemoteCache{b: b, src: src, resolve: resolve, log: log, slots: map[string]*slot{}}
}

// Acquire returns the loaded remote for p, loading or reloading it as its
// generation requires, and holds it until release is called. A p older than
// the loaded generation is ErrStaleGeneration.
func (c *RemoteCache) Acquire(p Peer) (r *Remote, release func(), err error) {
	if p.Key == "" {
		p.Key = p.AgentName
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, nil, fmt.Errorf("remote cache: %w", ErrClosed)
	}
	s, ok := c.slots[p.Key]
	if !ok {
		s = &slot{}
		c.slots[p.Key] = s
	}
	c.mu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.cur; cur != nil {
		switch {
		case cur.Generation == p.Generation && cur.AgentName == p.AgentName:
			return c.hold(cur)
		case cur.Generation > p.Generation:
			return nil, nil, fmt.Errorf("peer %s generation %d, loaded %d: %w", p.Key, p.Generation, cur.Generation, ErrStaleGeneration)
		}
		c.log.Info().Str(LogPeer, p.Key).Str(LogRemote+"_old", cur.AgentName).Int64(LogGeneration+"_old", cur.Generation).
			Str(LogRemote, p.AgentName).Int64(LogGeneration, p.Generation).Msg("peer re-registered; reloading its metadata")
		if err := c.evict(cur); err != nil {
			c.log.Warn().Err(err).Str(LogPeer, p.Key).Msg("evict the old generation")
		}
		s.cur = nil
	}
	r, err = c.load(p)
	if err != nil {
		return nil, nil, err
	}
	s.cur = r
	return c.hold(r)
}

func (c *RemoteCache) hold(r *Remote) (*Remote, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.retired {
		return nil, nil, fmt.Errorf("remote %s: %w", r.AgentName, ErrClosed)
	}
	r.refs++
	var once sync.Once
	return r, func() { once.Do(func() { c.unref(r) }) }, nil
}

func (c *RemoteCache) unref(r *Remote) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.refs--
	if r.retired && r.refs == 0 {
		close(r.drained)
	}
}

// load loads p's metadata, resolves its kinds and prepares its lists; on
// failure nothing stays loaded.
func (c *RemoteCache) load(p Peer) (*Remote, error) {
	if err := LoadPeer(c.b, p.AgentName, p.Metadata); err != nil {
		return nil, fmt.Errorf("load peer %s generation %d: %w", p.Key, p.Generation, err)
	}
	r := &Remote{AgentName: p.AgentName, Generation: p.Generation, drained: make(chan struct{})}
	fail := func(err error) (*Remote, error) {
		for _, pr := range r.Prepared {
			pr.Release()
		}
		if ierr := c.b.InvalidateRemote(p.AgentName); ierr != nil {
			err = errors.Join(err, ierr)
		}
		return nil, err
	}
	g := p.Geometry
	g.AgentName = p.AgentName
	d, err := c.resolve(c.src, g, p.AttnTPSize, p.AttnTPRank)
	if err != nil {
		return fail(fmt.Errorf("resolve peer %s: %w", p.Key, err))
	}
	r.Dest = d
	// A destination left unresolved (by a fault-injecting resolver) has no
	// layout; transfers to it fail in BuildPlan with the typed error.
	if _, perr := ChoosePath(c.src, d); perr != nil {
		return r, nil
	}
	l, err := BuildLayout(c.src, d)
	if err != nil {
		return fail(fmt.Errorf("layout for peer %s: %w", p.Key, err))
	}
	r.Layout = l
	for _, lp := range l.Lists {
		pr, err := c.b.Prepare(p.AgentName, lp.Local, lp.Dst)
		if err != nil {
			return fail(fmt.Errorf("prepare lists for peer %s: %w", p.Key, err))
		}
		r.Prepared = append(r.Prepared, pr)
	}
	return r, nil
}

// evict retires r, waits for its transfers, releases its prepared lists and
// invalidates its metadata.
func (c *RemoteCache) evict(r *Remote) error {
	c.mu.Lock()
	r.retired = true
	if r.refs == 0 {
		close(r.drained)
	}
	c.mu.Unlock()
	<-r.drained
	var errs []error
	for _, pr := range r.Prepared {
		errs = append(errs, pr.Release())
	}
	r.Prepared = nil
	if err := c.b.InvalidateRemote(r.AgentName); err != nil && !errors.Is(err, ErrUnknownAgent) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Evict drops the peer with key, if loaded.
func (c *RemoteCache) Evict(key string) error {
	c.mu.Lock()
	s, ok := c.slots[key]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	err := c.evict(s.cur)
	s.cur = nil
	return err
}

// Loaded returns the agent name and generation loaded for key.
func (c *RemoteCache) Loaded(key string) (agent string, generation int64, ok bool) {
	c.mu.Lock()
	s, found := c.slots[key]
	c.mu.Unlock()
	if !found {
		return "", 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return "", 0, false
	}
	return s.cur.AgentName, s.cur.Generation, true
}

// Keys returns the keys of the peers acquired so far (loaded, or evicted
// since), in no particular order.
func (c *RemoteCache) Keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Collect(maps.Keys(c.slots))
}

// EvictAll drops every loaded peer, waiting for their transfers; the next
// Acquire of each loads it again.
func (c *RemoteCache) EvictAll() error {
	var errs []error
	for _, k := range c.Keys() {
		errs = append(errs, c.Evict(k))
	}
	return errors.Join(errs...)
}

// Close evicts every peer (waiting for their transfers) and refuses new
// acquisitions.
func (c *RemoteCache) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.EvictAll()
}
