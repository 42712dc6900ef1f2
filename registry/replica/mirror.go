package replica

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/rs/zerolog"
)

// MirrorConfig configures a Mirror.
type MirrorConfig struct {
	// Debounce is the least time between two snapshot rebuilds from the
	// store's reads, and between two from stale hints: a change that
	// arrives sooner after the last rebuild of its kind waits out the rest,
	// with every other change that arrives meanwhile. It bounds how often
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
		c.LoadRefresh = registry.DefaultHeartbeatInterval
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
//
// Two goroutines share the work. follow takes each announcement as it
// arrives: a stale hint (Change.Stale) goes into the routes (at once
// after a quiet spell), and changed peers are queued for run, which reads
// them back from the store and publishes what it read. A read that waits
// on a busy or absent database therefore never holds a stale hint back.
type Mirror struct {
	cfg   MirrorConfig
	store registry.Store
	log   zerolog.Logger

	cur   atomic.Pointer[Snapshot]
	loads LoadTable // shared by every snapshot

	// pmu guards what snapshots are built from; every publish holds it.
	pmu sync.Mutex
	// peers is what the current snapshot was built from, by ID. A record
	// is never modified once stored; a change stores a new one.
	peers   map[string]*registry.Peer
	pairs   pairState // what the current snapshot's pairs were built from
	version uint64
	// reading is set while run reads the store. Hints applied meanwhile
	// are kept in late and applied again over what that read returns,
	// which may predate them.
	reading bool
	late    []registry.StaleHint

	// qmu guards the changes follow queued for run; kick wakes run.
	qmu        sync.Mutex
	pendingIDs map[string]struct{}
	pendingAll bool
	kick       chan struct{}

	mu       sync.Mutex
	watchers map[chan *Snapshot]struct{}
}

// NewMirror returns a mirror of store; call Start before Snapshot.
func NewMirror(cfg MirrorConfig, store registry.Store, log zerolog.Logger) *Mirror {
	m := &Mirror{cfg: cfg.WithDefaults(), store: store, log: log, watchers: map[chan *Snapshot]struct{}{},
		pendingIDs: map[string]struct{}{}, kick: make(chan struct{}, 1)}
	m.cur.Store(NewSnapshot(0, nil, nil, m.cfg.Now()))
	return m
}

// Start loads the whole store and follows its changes until ctx ends.
func (m *Mirror) Start(ctx context.Context) error {
	changes := m.store.Subscribe(ctx) // subscribe first so nothing slips between load and follow
	peers, err := m.store.List(ctx, registry.Filter{})
	if err != nil {
		return fmt.Errorf("load peers: %w", err)
	}
	pairs, err := m.loadPairs(ctx)
	if err != nil {
		return err
	}
	m.pmu.Lock()
	m.publishAll(peers, pairs)
	m.pmu.Unlock()
	go m.follow(ctx, changes)
	go m.run(ctx)
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

// follow takes the store's announcements until ctx ends (or the store
// closes changes; run then idles until ctx ends): hints into the routes,
// changed peers queued for run. A hint after a quiet spell is applied at
// once; hints within Debounce of the last ones gather until it has
// passed, so that a storm of them (a lease sweep marking a rack stale)
// builds a snapshot per Debounce rather than one per peer.
//
// A change's peers are queued only once its hints are applied, so that a
// read of each hinted peer begins after its hint: that read, not the hint,
// has the last word (the peer may be ready again by then). Changes that
// arrive while hints gather wait with them.
func (m *Mirror) follow(ctx context.Context, changes <-chan registry.Change) {
	var lastHints time.Time
	for {
		var c registry.Change
		select {
		case <-ctx.Done():
			return
		case more, ok := <-changes:
			if !ok {
				return
			}
			c = more
		}
		if len(c.Stale) == 0 {
			m.hand(c.PeerIDs, c.ReloadAll())
			continue
		}
		hints, ids, all := c.Stale, c.PeerIDs, c.ReloadAll()
		if wait := m.cfg.Debounce - time.Since(lastHints); wait > 0 {
			t := time.NewTimer(wait)
		gather:
			for {
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case more, ok := <-changes:
					if !ok {
						break gather
					}
					hints, ids, all = append(hints, more.Stale...), append(ids, more.PeerIDs...), all || more.ReloadAll()
				case <-t.C:
					break gather
				}
			}
			t.Stop()
		}
		m.takeOutStale(hints)
		lastHints = time.Now()
		m.hand(ids, all)
	}
}

// hand queues changed peers (or a reload of everything) for run and wakes
// it. Every announcement wakes run, even one of hints alone: while run
// retries a failed refresh, any announcement says the store answers again.
func (m *Mirror) hand(ids []string, all bool) {
	m.queue(ids, all)
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// queue adds changed peers (or a reload of everything) to run's work.
func (m *Mirror) queue(ids []string, all bool) {
	m.qmu.Lock()
	defer m.qmu.Unlock()
	for _, id := range ids {
		m.pendingIDs[id] = struct{}{}
	}
	m.pendingAll = m.pendingAll || all
}

// takeQueued returns and clears run's work.
func (m *Mirror) takeQueued() (map[string]struct{}, bool) {
	m.qmu.Lock()
	defer m.qmu.Unlock()
	ids, all := m.pendingIDs, m.pendingAll
	m.pendingIDs, m.pendingAll = map[string]struct{}{}, false
	return ids, all
}

// run reads back the peers follow queued and publishes them, until ctx
// ends. A refresh that fails (the store is away, or its first query after
// an outage meets a broken connection) is queued again and retried with
// backoff, since the change that asked for it — often the full reload
// after the listener reconnected — will not come again.
func (m *Mirror) run(ctx context.Context) {
	retrying, backoff := false, m.cfg.MinRetry
	var lastRebuild time.Time
	for {
		var retry <-chan time.Time
		var t *time.Timer
		if retrying {
			t = time.NewTimer(backoff)
			retry = t.C
		}
		select {
		case <-ctx.Done():
		case <-m.kick:
		case <-retry:
			backoff = min(2*backoff, m.cfg.MaxRetry)
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		// Wait out the rest of Debounce since the last rebuild: a change
		// after a quiet spell is applied at once, while a storm of changes
		// still rebuilds at most once per Debounce, with what the wait
		// gathered.
		if wait := m.cfg.Debounce - time.Since(lastRebuild); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		// The wake-ups of what the wait gathered are spent here, before
		// taking it: left over, one would cut the backoff short should
		// this refresh fail. One that comes after this still has work.
		select {
		case <-m.kick:
		default:
		}
		ids, all := m.takeQueued()
		if len(ids) == 0 && !all {
			continue // only hints so far: their changes follow
		}
		lastRebuild = time.Now()
		if err := m.apply(ctx, ids, all); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.queue(slices.Collect(maps.Keys(ids)), all)
			m.log.Warn().Err(err).Dur("retry_in", backoff).Msg("refresh registry snapshot; routing from the previous one")
			retrying = true
			continue
		}
		retrying, backoff = false, m.cfg.MinRetry
	}
}

// reloadAbove is how many changed peers make a refresh read every peer in
// one query instead of each changed one in its own: a mirror that fell
// behind (a burst of registrations, a fleet's first heartbeats) catches up
// in one round trip instead of thousands, each waiting for a connection.
const reloadAbove = 64

// apply reads the changed peers (every peer when all) from the store and
// publishes them. Hints that arrive during the read are applied again over
// it; a failed read leaves the mirror as it was, to be retried whole.
func (m *Mirror) apply(ctx context.Context, ids map[string]struct{}, all bool) error {
	m.pmu.Lock()
	m.reading, m.late = true, nil
	m.pmu.Unlock()
	defer func() {
		m.pmu.Lock()
		m.reading, m.late = false, nil
		m.pmu.Unlock()
	}()
	if all || len(ids) > reloadAbove {
		peers, err := m.store.List(ctx, registry.Filter{})
		if err != nil {
			return fmt.Errorf("reload peers: %w", err)
		}
		pairs, err := m.loadPairs(ctx)
		if err != nil {
			return err
		}
		m.pmu.Lock()
		defer m.pmu.Unlock()
		m.publishAll(peers, pairs)
		return nil
	}
	keys := slices.Collect(maps.Keys(ids))
	peers, pairs, err := m.refresh(ctx, keys)
	if err != nil {
		return err
	}
	changed := make(map[string]*registry.Peer, len(keys))
	for _, id := range keys {
		changed[id] = nil // gone, unless read below
	}
	for i := range peers {
		changed[peers[i].ID] = &peers[i]
	}
	m.pmu.Lock()
	defer m.pmu.Unlock()
	for id, p := range changed {
		if p == nil {
			delete(m.peers, id)
		} else {
			m.peers[id] = p
		}
	}
	late := m.staleCopies(m.late)
	maps.Copy(m.peers, late)
	maps.Copy(changed, late)
	m.publish(changed, pairs)
	return nil
}

// takeOutStale publishes a snapshot in which the peers a change hinted
// stale (Change.Stale) are stale, before the refresh that reads them back:
// routers stop picking them one database round trip sooner, and without
// waiting for a refresh already under way. The store announces each
// hinted peer's change too, and the refresh that follows it replaces these
// records with the store's. A hint only takes a peer out of the routes, and
// not one of a later generation than the hint's (it registered again
// since): a late hint about a peer that is ready again in the same
// generation keeps it out until that refresh.
func (m *Mirror) takeOutStale(hints []registry.StaleHint) {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	if m.reading {
		m.late = append(m.late, hints...)
	}
	changed := m.staleCopies(hints)
	if changed == nil {
		return
	}
	maps.Copy(m.peers, changed)
	m.publish(changed, m.pairs)
}

// staleCopies returns a stale copy of each peer in m.peers that hints take
// out of the routes, by ID, or nil when there is none. m.pmu is held.
func (m *Mirror) staleCopies(hints []registry.StaleHint) map[string]*registry.Peer {
	var changed map[string]*registry.Peer
	for _, h := range hints {
		p := m.peers[h.ID]
		if p == nil || p.State == registry.StateStale || p.Generation > h.Generation {
			continue
		}
		cp := *p
		cp.State = registry.StateStale
		if changed == nil {
			changed = map[string]*registry.Peer{}
		}
		changed[h.ID] = &cp
	}
	return changed
}

// refresh reads the peers with ids that still exist, and the pair state:
// in one go from a Refresher (one round trip to a database), else one
// read at a time.
func (m *Mirror) refresh(ctx context.Context, ids []string) ([]registry.Peer, pairState, error) {
	if r, ok := m.store.(registry.Refresher); ok {
		peers, qs, pfs, err := r.Refresh(ctx, ids)
		if err != nil {
			return nil, pairState{}, fmt.Errorf("reload peers: %w", err)
		}
		return peers, pairState{quarantines: qs, preflights: pfs}, nil
	}
	peers := make([]registry.Peer, 0, len(ids))
	for _, id := range ids {
		p, err := m.store.Get(ctx, id)
		switch {
		case errors.Is(err, registry.ErrNotFound):
		case err != nil:
			return nil, pairState{}, fmt.Errorf("reload peer %s: %w", id, err)
		default:
			peers = append(peers, p)
		}
	}
	pairs, err := m.loadPairs(ctx)
	return peers, pairs, err
}

// publishAll makes the snapshot of peers, built whole, current, with the
// hints that arrived while they were read applied over them. m.pmu is held.
func (m *Mirror) publishAll(peers []registry.Peer, pairs pairState) {
	m.peers = make(map[string]*registry.Peer, len(peers))
	for i := range peers {
		m.peers[peers[i].ID] = &peers[i]
	}
	maps.Copy(m.peers, m.staleCopies(m.late))
	m.publish(nil, pairs)
}

// pairState is what a snapshot holds of pairs besides their peers.
type pairState struct {
	quarantines []registry.Quarantine
	preflights  []registry.Preflight
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
// peers that changed (nil: build it whole) and makes it current. m.pmu is
// held.
func (m *Mirror) publish(changed map[string]*registry.Peer, pairs pairState) {
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
