package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// MirrorConfig configures a Mirror.
type MirrorConfig struct {
	// Debounce is the least time between two snapshot rebuilds: a change
	// that arrives sooner after the last rebuild waits out the rest, with
	// every other change that arrives meanwhile. It bounds how often
	// snapshots are rebuilt under a storm of changes; a change after a
	// quiet spell is applied at once.
	Debounce time.Duration
	// MinRetry and MaxRetry bound the backoff between attempts to refresh
	// the snapshot after a refresh failed.
	MinRetry, MaxRetry time.Duration
	// LoadRefresh is how often the peers' loads are read from the store;
	// heartbeats change them without announcing a change. Default: the
	// default heartbeat interval; negative turns the reads off (loads then
	// change only with snapshots).
	LoadRefresh time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// WithDefaults fills in unset fields.
func (c MirrorConfig) WithDefaults() MirrorConfig {
	if c.Debounce == 0 {
		c.Debounce = 5 * time.Millisecond
	}
	if c.MinRetry == 0 {
		c.MinRetry = 50 * time.Millisecond
	}
	if c.MaxRetry == 0 {
		c.MaxRetry = 2 * time.Second
	}
	if c.LoadRefresh == 0 {
		c.LoadRefresh = DefaultHeartbeatInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Mirror keeps an in-memory Snapshot of a Store current: it loads everything
// once, then follows the store's change announcements, reloads only the
// peers that changed and builds the next snapshot from the previous one
// and those peers.
type Mirror struct {
	cfg   MirrorConfig
	store Store
	log   zerolog.Logger

	cur atomic.Pointer[Snapshot]
	// peers is what the current snapshot was built from, by ID, owned by
	// the run loop after Start. A record is never modified once stored; a
	// change stores a new one.
	peers   map[string]*Peer
	pairs   pairState // what the current snapshot's pairs were built from
	version uint64
	loads   LoadTable // shared by every snapshot

	mu       sync.Mutex
	watchers map[chan *Snapshot]struct{}
}

// NewMirror returns a mirror of store; call Start before Snapshot.
func NewMirror(cfg MirrorConfig, store Store, log zerolog.Logger) *Mirror {
	m := &Mirror{cfg: cfg.WithDefaults(), store: store, log: log, watchers: map[chan *Snapshot]struct{}{}}
	m.cur.Store(NewSnapshot(0, nil, nil, m.cfg.Now()))
	return m
}

// Start loads the whole store and follows its changes until ctx ends.
func (m *Mirror) Start(ctx context.Context) error {
	changes := m.store.Subscribe(ctx) // subscribe first so nothing slips between load and follow
	peers, err := m.store.List(ctx, Filter{})
	if err != nil {
		return fmt.Errorf("load peers: %w", err)
	}
	if err := m.publishAll(ctx, peers); err != nil {
		return err
	}
	go m.run(ctx, changes)
	if m.cfg.LoadRefresh > 0 {
		go m.refreshLoads(ctx)
	}
	return nil
}

// refreshLoads reads every peer's load into the shared table each
// LoadRefresh until ctx ends.
func (m *Mirror) refreshLoads(ctx context.Context) {
	t := time.NewTicker(m.cfg.LoadRefresh)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		loads, err := m.store.Loads(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			m.log.Warn().Err(err).Msg("read peer loads; routing keeps the last ones")
			failing = true
		case err == nil:
			m.loads.Set(loads)
			failing = false
		}
	}
}

// Snapshot returns the current snapshot. It never blocks.
func (m *Mirror) Snapshot() *Snapshot { return m.cur.Load() }

// Watch returns a channel that receives each new snapshot (the latest one
// when the receiver falls behind) until ctx ends.
func (m *Mirror) Watch(ctx context.Context) <-chan *Snapshot {
	ch := make(chan *Snapshot, 1)
	m.mu.Lock()
	m.watchers[ch] = struct{}{}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		delete(m.watchers, ch)
		m.mu.Unlock()
	}()
	return ch
}

func (m *Mirror) run(ctx context.Context, changes <-chan Change) {
	// ids and all are what the snapshot still has to catch up with. They
	// are kept until a refresh succeeds: a refresh that fails (the store is
	// away, or its first query after an outage meets a broken connection)
	// is retried with backoff, since the change that asked for it — often
	// the full reload after the listener reconnected — will not come again.
	ids, all := map[string]struct{}{}, false
	var stale []StaleHint // not yet taken out of the routes
	merge := func(c Change) {
		if c.ReloadAll() {
			all = true
		}
		for _, id := range c.PeerIDs {
			ids[id] = struct{}{}
		}
		stale = append(stale, c.Stale...)
	}
	applyHints := func() {
		if len(stale) > 0 {
			m.takeOutStale(stale)
			stale = stale[:0]
		}
	}
	retrying, backoff := false, m.cfg.MinRetry
	var lastRebuild time.Time
	for {
		if retrying {
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case c, ok := <-changes:
				timer.Stop()
				if !ok {
					return
				}
				merge(c) // a notification arrived: the store answers again
			case <-timer.C:
				backoff = min(2*backoff, m.cfg.MaxRetry)
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case c, ok := <-changes:
				if !ok {
					return
				}
				merge(c)
			}
		}
		applyHints()
		// Gather what else arrives until Debounce after the last rebuild:
		// a change after a quiet spell is applied at once (a stale mark
		// reaches the router without waiting out a window), while a storm
		// of changes still rebuilds at most once per Debounce.
		if !m.gather(ctx, changes, merge, m.cfg.Debounce-time.Since(lastRebuild)) {
			return
		}
		applyHints() // hints that arrived meanwhile
		if len(ids) == 0 && !all {
			continue // only hints so far: their changes follow
		}
		lastRebuild = time.Now()
		if err := m.apply(ctx, ids, all); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Warn().Err(err).Dur("retry_in", backoff).Msg("refresh registry snapshot; routing from the previous one")
			retrying = true
			continue
		}
		ids, all = map[string]struct{}{}, false
		retrying, backoff = false, m.cfg.MinRetry
	}
}

// gather merges the changes that arrive within wait; when wait is not
// positive it returns at once, having merged at most what was already
// queued. It reports false when ctx ended.
func (m *Mirror) gather(ctx context.Context, changes <-chan Change, merge func(Change), wait time.Duration) bool {
	done := make(chan time.Time)
	close(done)
	fire := (<-chan time.Time)(done)
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		fire = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case more, ok := <-changes:
			if !ok {
				return true
			}
			merge(more)
		case <-fire:
			return true
		}
	}
}

// reloadAbove is how many changed peers make a refresh read every peer in
// one query instead of each changed one in its own: a mirror that fell
// behind (a burst of registrations, a fleet's first heartbeats) catches up
// in one round trip instead of thousands, each waiting for a connection.
const reloadAbove = 64

func (m *Mirror) apply(ctx context.Context, ids map[string]struct{}, all bool) error {
	if all || len(ids) > reloadAbove {
		peers, err := m.store.List(ctx, Filter{})
		if err != nil {
			return fmt.Errorf("reload peers: %w", err)
		}
		return m.publishAll(ctx, peers)
	}
	// Read every changed peer before changing anything: a failed read
	// leaves the mirror as it was, to be retried whole.
	keys := slices.Collect(maps.Keys(ids))
	peers, pairs, err := m.refresh(ctx, keys)
	if err != nil {
		return err
	}
	changed := make(map[string]*Peer, len(keys))
	for _, id := range keys {
		changed[id] = nil // gone, unless read below
	}
	for i := range peers {
		changed[peers[i].ID] = &peers[i]
	}
	for id, p := range changed {
		if p == nil {
			delete(m.peers, id)
		} else {
			m.peers[id] = p
		}
	}
	m.publish(changed, pairs)
	return nil
}

// takeOutStale publishes a snapshot in which the peers a change hinted
// stale (Change.Stale) are stale, before the refresh that reads them back:
// routers stop picking them one database round trip sooner. The store
// announces each hinted peer's change too, and the refresh that follows it
// replaces these records with the store's. A hint only takes a peer out of
// the routes, and not one of a later generation than the hint's (it
// registered again since): a late hint about a peer that is ready again
// in the same generation keeps it out until that refresh.
func (m *Mirror) takeOutStale(hints []StaleHint) {
	var changed map[string]*Peer
	for _, h := range hints {
		id := h.ID
		p := m.peers[id]
		if p == nil || p.State == StateStale || p.Generation > h.Generation {
			continue
		}
		cp := *p
		cp.State = StateStale
		if changed == nil {
			changed = map[string]*Peer{}
		}
		changed[id] = &cp
	}
	if changed == nil {
		return
	}
	for id, p := range changed {
		m.peers[id] = p
	}
	m.publish(changed, m.pairs)
}

// refresh reads the peers with ids that still exist, and the pair state:
// in one go from a Refresher (one round trip to a database), else one
// read at a time.
func (m *Mirror) refresh(ctx context.Context, ids []string) ([]Peer, pairState, error) {
	if r, ok := m.store.(Refresher); ok {
		peers, qs, pfs, err := r.Refresh(ctx, ids)
		if err != nil {
			return nil, pairState{}, fmt.Errorf("reload peers: %w", err)
		}
		return peers, pairState{quarantines: qs, preflights: pfs}, nil
	}
	peers := make([]Peer, 0, len(ids))
	for _, id := range ids {
		p, err := m.store.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, pairState{}, fmt.Errorf("reload peer %s: %w", id, err)
		default:
			peers = append(peers, p)
		}
	}
	pairs, err := m.loadPairs(ctx)
	return peers, pairs, err
}

// publishAll makes the snapshot of peers, built whole, current.
func (m *Mirror) publishAll(ctx context.Context, peers []Peer) error {
	pairs, err := m.loadPairs(ctx)
	if err != nil {
		return err
	}
	m.peers = make(map[string]*Peer, len(peers))
	for i := range peers {
		m.peers[peers[i].ID] = &peers[i]
	}
	m.publish(nil, pairs)
	return nil
}

// pairState is what a snapshot holds of pairs besides their peers.
type pairState struct {
	quarantines []Quarantine
	preflights  []Preflight
}

func (m *Mirror) loadPairs(ctx context.Context) (pairState, error) {
	qs, err := m.store.Quarantines(ctx)
	if err != nil {
		return pairState{}, fmt.Errorf("load quarantines: %w", err)
	}
	pfs, err := m.store.Preflights(ctx)
	if err != nil {
		return pairState{}, fmt.Errorf("load preflights: %w", err)
	}
	return pairState{quarantines: qs, preflights: pfs}, nil
}

// publish builds the snapshot of m.peers from the current one and the
// peers that changed (nil: build it whole) and makes it current.
func (m *Mirror) publish(changed map[string]*Peer, pairs pairState) {
	m.pairs = pairs
	m.version++
	in := snapshotInput{version: m.version, changed: changed,
		quarantines: pairs.quarantines, preflights: pairs.preflights, now: m.cfg.Now()}
	prev := m.cur.Load()
	if changed == nil {
		prev, in.peers = nil, slices.Collect(maps.Values(m.peers))
	}
	s := buildSnapshot(prev, in)
	s.loads = &m.loads
	m.cur.Store(s)
	m.mu.Lock()
	for ch := range m.watchers {
		select {
		case <-ch: // drop the unread older snapshot
		default:
		}
		select {
		case ch <- s:
		default:
		}
	}
	m.mu.Unlock()
}
