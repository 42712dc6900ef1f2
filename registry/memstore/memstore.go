// Package memstore is the embedded, in-memory registry store: the default when
// no database is configured. It keeps everything in one process; peers
// re-register through their heartbeats after a restart, so nothing that
// matters is lost.
package memstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// Config configures a Store.
type Config struct {
	LeaseTTL time.Duration    // how long a heartbeat keeps a peer alive
	Now      func() time.Time // the clock; time.Now when nil
	// MaxEvents bounds the event log kept in memory; the oldest go first.
	MaxEvents int
	// Heal times and limits the heal plans of stale peers.
	Heal registry.HealConfig
	// QuarantineTTL is how long a quarantine lasts before its pair goes on
	// trial; zero keeps quarantines until they are lifted.
	QuarantineTTL time.Duration
}

// WithDefaults fills in unset fields.
func (c Config) WithDefaults() Config {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = registry.DefaultLeaseTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxEvents == 0 {
		c.MaxEvents = 100_000
	}
	return c
}

// Store is the in-memory registry.Store. One mutex guards everything: the
// store is small and its callers are the API handlers, not the router's hot
// path (the router reads snapshots).
type Store struct {
	cfg Config
	bc  replica.Broadcaster

	mu          sync.Mutex
	byID        map[string]*registry.Peer
	byName      map[string]string
	events      []registry.Event
	lastEvent   int64
	quarantines map[[2]string]registry.Quarantine
	failures    map[[2]string]registry.PairFailure
	preflights  map[[2]string]registry.Preflight
	exchanges   map[[2]string]time.Time // a pair's latest exchange (exchange.go)
	probes      map[string]registry.Probe
}

var _ registry.Store = (*Store)(nil)

// New returns an empty store.
func New(cfg Config) *Store {
	return &Store{
		cfg:         cfg.WithDefaults(),
		byID:        map[string]*registry.Peer{},
		byName:      map[string]string{},
		quarantines: map[[2]string]registry.Quarantine{},
		failures:    map[[2]string]registry.PairFailure{},
		preflights:  map[[2]string]registry.Preflight{},
		exchanges:   map[[2]string]time.Time{},
		probes:      map[string]registry.Probe{},
	}
}

// NewID returns a random UUID (version 4), the form peer IDs take in both
// stores.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// clone deep-copies a peer so callers never share memory with the store.
func clone(p *registry.Peer) registry.Peer {
	c := *p
	if p.Labels != nil {
		c.Labels = make(map[string]string, len(p.Labels))
		for k, v := range p.Labels {
			c.Labels[k] = v
		}
	}
	c.Observed, c.Unknown = slices.Clone(p.Observed), slices.Clone(p.Unknown)
	c.Ranks = nil // a peer whose ranks are unknown has none, as pgstore returns it
	if p.Ranks != nil {
		c.Ranks = make([]registry.Rank, len(p.Ranks))
	}
	for i, r := range p.Ranks {
		r.AgentMetadata = slices.Clone(r.AgentMetadata)
		r.KVDataPtrs = slices.Clone(r.KVDataPtrs)
		r.KVDataLens = slices.Clone(r.KVDataLens)
		r.KVItemLens = slices.Clone(r.KVItemLens)
		r.KVMemKinds = slices.Clone(r.KVMemKinds)
		r.AuxDataPtrs = slices.Clone(r.AuxDataPtrs)
		r.AuxDataLens = slices.Clone(r.AuxDataLens)
		r.TransferSecret = slices.Clone(r.TransferSecret)
		c.Ranks[i] = r
	}
	if p.LastHeartbeat != nil {
		t := *p.LastHeartbeat
		c.LastHeartbeat = &t
	}
	return c
}

// now returns the clock truncated to microseconds, as PostgreSQL stores
// time, so that both stores answer alike.
func (s *Store) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// put stores p and appends its events; the caller holds mu. p's slices
// must belong to the store: a registration's are cloned first, and the
// life-cycle rules only ever share the stored peer's own. A heartbeat thus
// copies no rank data, however large its NIXL metadata.
func (s *Store) put(p registry.Peer, events []registry.Event) {
	s.byID[p.ID] = &p
	s.byName[p.Name] = p.ID
	s.log(&p, events)
}

func (s *Store) log(p *registry.Peer, events []registry.Event) {
	for _, e := range events {
		s.lastEvent++
		e.ID, e.PeerID, e.PeerName, e.Generation, e.At = s.lastEvent, p.ID, p.Name, p.Generation, s.now()
		s.events = append(s.events, e)
	}
	if over := len(s.events) - s.cfg.MaxEvents; over > 0 {
		s.events = slices.Delete(s.events, 0, over)
	}
}

func (s *Store) publish(ids ...string) { s.bc.Publish(registry.Change{PeerIDs: ids}) }

func (s *Store) find(id string) (*registry.Peer, error) {
	p, ok := s.byID[id]
	if !ok {
		return nil, fmt.Errorf("peer %s: %w", id, registry.ErrNotFound)
	}
	return p, nil
}

// Register implements registry.Store.
func (s *Store) Register(_ context.Context, spec registry.PeerSpec, claim registry.Claim) (registry.RegisterResult, error) {
	if err := spec.Validate(); err != nil {
		return registry.RegisterResult{}, err
	}
	s.mu.Lock()
	now := s.now()
	var res registry.RegisterResult
	var prev *registry.Peer
	if id, ok := s.byName[spec.Name]; ok {
		prev = s.byID[id]
	}
	issue, err := registry.AuthorizeRegistration(prev, &spec, claim, now)
	if err == nil {
		holders := s.agentHolders(&spec, now)
		err = registry.CheckAgentNames(&spec, func(agent string) (string, bool) {
			name, ok := holders[agent]
			return name, ok
		})
	}
	if err != nil {
		s.mu.Unlock()
		return res, fmt.Errorf("register peer %s: %w", spec.Name, err)
	}
	var next registry.Peer
	var events []registry.Event
	if prev != nil {
		var clearQ bool
		next, events, clearQ = registry.Reregister(*prev, spec, now, s.cfg.LeaseTTL)
		if clearQ {
			s.clearQuarantines(prev.ID)
		}
		events = append(events, s.liftHealed(registry.HealedPairs(*prev, next), prev.ID, next.Generation)...)
	} else {
		next, events = registry.NewPeer(NewID(), spec, now, s.cfg.LeaseTTL)
		res.Created = true
	}
	if issue {
		if res.Credential, next.CredentialHash, err = registry.NewCredential(next.ID); err != nil {
			s.mu.Unlock()
			return registry.RegisterResult{}, err
		}
	}
	next = clone(&next) // never keep the caller's slices
	s.put(next, events)
	res.Peer = clone(&next)
	s.mu.Unlock()
	s.publish(res.Peer.ID)
	return res, nil
}

// agentHolders maps each of spec's NIXL agent names that a live peer
// other than spec's (by name) registered to that peer's name; the caller
// holds mu. Registrations are rare next to heartbeats, so it searches, in
// one pass over the peers, rather than keeping an index up to date.
func (s *Store) agentHolders(spec *registry.PeerSpec, now time.Time) map[string]string {
	agents := make(map[string]struct{}, len(spec.Ranks))
	for i := range spec.Ranks {
		agents[spec.Ranks[i].AgentName] = struct{}{}
	}
	holders := map[string]string{}
	for _, p := range s.byID {
		if p.Name == spec.Name || !p.Live(now) {
			continue
		}
		for i := range p.Ranks {
			if _, ok := agents[p.Ranks[i].AgentName]; ok {
				holders[p.Ranks[i].AgentName] = p.Name
			}
		}
	}
	return holders
}

// liftHealed lifts the quarantines of the pairs (prefill, decodeID) that
// a heal ended and returns their events; the caller holds mu.
func (s *Store) liftHealed(prefills []string, decodeID string, generation int64) []registry.Event {
	var events []registry.Event
	for _, pid := range prefills {
		key := [2]string{pid, decodeID}
		if _, ok := s.quarantines[key]; ok {
			delete(s.quarantines, key)
			name := pid
			if p, ok := s.byID[pid]; ok {
				name = p.Name
			}
			events = append(events, registry.HealedLift(name, generation))
		}
	}
	return events
}

func (s *Store) clearQuarantines(id string) {
	for k := range s.quarantines {
		if k[0] == id || k[1] == id {
			delete(s.quarantines, k)
		}
	}
	for k := range s.failures {
		if k[0] == id || k[1] == id {
			delete(s.failures, k)
		}
	}
}

// Get implements registry.Store.
func (s *Store) Get(_ context.Context, id string) (registry.Peer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.find(id)
	if err != nil {
		return registry.Peer{}, err
	}
	return clone(p), nil
}

// List implements registry.Store; peers come sorted by name.
func (s *Store) List(_ context.Context, f registry.Filter) ([]registry.Peer, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []registry.Peer{}
	for _, p := range s.byID {
		if f.Match(p) {
			out = append(out, clone(p))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Loads implements registry.Store.
func (s *Store) Loads(_ context.Context) ([]registry.PeerLoad, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]registry.PeerLoad, 0, len(s.byID))
	for _, p := range s.byID {
		if p.LastHeartbeat != nil {
			out = append(out, registry.PeerLoad{PeerID: p.ID, Load: p.Load, At: *p.LastHeartbeat})
		}
	}
	return out, nil
}

// Delete implements registry.Store.
func (s *Store) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	p, err := s.find(id)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.byID, id)
	delete(s.byName, p.Name)
	s.clearQuarantines(id)
	s.forgetPreflights(id)
	s.log(p, []registry.Event{{Kind: registry.EventRemoved, Message: "removed by operator"}})
	s.mu.Unlock()
	s.publish(id)
	return nil
}

// Drain implements registry.Store.
func (s *Store) Drain(_ context.Context, id string) (registry.Peer, error) {
	return s.update(id, func(p registry.Peer, now time.Time) (registry.Peer, []registry.Event) {
		return registry.ApplyDrain(p, now)
	})
}

// MarkStale implements registry.Store.
func (s *Store) MarkStale(_ context.Context, id, reason, errText string) (registry.Peer, error) {
	if err := registry.ValidateStaleMark(reason, errText); err != nil {
		return registry.Peer{}, err
	}
	return s.update(id, func(p registry.Peer, now time.Time) (registry.Peer, []registry.Event) {
		return registry.ApplyStale(p, reason, errText, now, s.cfg.Heal)
	})
}

func (s *Store) update(id string, f func(registry.Peer, time.Time) (registry.Peer, []registry.Event)) (registry.Peer, error) {
	s.mu.Lock()
	p, err := s.find(id)
	if err != nil {
		s.mu.Unlock()
		return registry.Peer{}, err
	}
	next, events := f(*p, s.now())
	s.put(next, events)
	out := clone(&next)
	s.mu.Unlock()
	s.publish(id)
	return out, nil
}

// Heartbeat implements registry.Store.
func (s *Store) Heartbeat(_ context.Context, hb registry.Heartbeat) (registry.HeartbeatReply, error) {
	if err := hb.Validate(); err != nil {
		return registry.HeartbeatReply{}, err
	}
	s.mu.Lock()
	p, err := s.find(hb.PeerID)
	if err != nil {
		s.mu.Unlock()
		return registry.HeartbeatReply{}, err
	}
	next, reply, events := registry.ApplyHeartbeat(*p, hb, s.now(), s.cfg.LeaseTTL, s.cfg.Heal)
	s.put(next, events)
	s.mu.Unlock()
	if next.State != p.State {
		s.publish(hb.PeerID)
	}
	return reply, nil
}

// ReportTransferFailure implements registry.Store.
func (s *Store) ReportTransferFailure(_ context.Context, f registry.TransferFailure) (registry.Peer, registry.TransferOutcome, error) {
	if err := f.Validate(); err != nil {
		return registry.Peer{}, "", err
	}
	s.mu.Lock()
	d, err := s.find(f.DecodeID)
	if err != nil {
		s.mu.Unlock()
		return registry.Peer{}, "", err
	}
	var prefill *registry.Peer
	if f.PrefillID != "" {
		if prefill, err = s.find(f.PrefillID); err != nil {
			s.mu.Unlock()
			return registry.Peer{}, "", err
		}
	}
	key := [2]string{f.PrefillID, f.DecodeID}
	var last *registry.PairFailure
	if lf, ok := s.failures[key]; ok {
		last = &lf
	}
	now := s.now()
	var cur *registry.Quarantine
	if cq, ok := s.quarantines[key]; ok {
		cur = &cq
	}
	others := registry.OtherPrefills(d, f.PrefillID, s.prefills(), func(pid string) bool {
		q, ok := s.quarantines[[2]string{pid, f.DecodeID}]
		return ok && q.Active()
	})
	next, events, q, rec, out := registry.ApplyPairTransferFailure(*d, prefill, f, last, cur, now, registry.DefaultQuarantineWindow, s.cfg.QuarantineTTL, s.cfg.Heal, others)
	if q != nil {
		s.quarantines[key] = *q
		s.log(d, []registry.Event{{Kind: registry.EventQuarantined, Message: q.Detail, Error: f.Error}})
	}
	if rec != nil {
		s.failures[key] = *rec
	}
	res := clone(d)
	changed := registry.TransferFailureChanged(events, q)
	if changed && (len(events) > 0 || out == registry.OutcomeHealPending) {
		s.put(next, events)
		res = clone(&next)
	}
	s.mu.Unlock()
	if changed && (out == registry.OutcomeStale || out == registry.OutcomeQuarantined || out == registry.OutcomeHealPending) {
		s.publish(f.DecodeID)
	}
	return res, out, nil
}

// prefills returns the peers that prefill; the caller holds mu. The
// peers are the store's own: read them, never keep them.
func (s *Store) prefills() []registry.Peer {
	var out []registry.Peer
	for _, p := range s.byID {
		if p.Role.Prefills() {
			out = append(out, *p)
		}
	}
	return out
}

// Quarantines implements registry.Store.
func (s *Store) Quarantines(context.Context) ([]registry.Quarantine, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]registry.Quarantine, 0, len(s.quarantines))
	for _, q := range s.quarantines {
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}

// ExpireLeases implements registry.Store.
func (s *Store) ExpireLeases(_ context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	var ids []string
	for id, p := range s.byID {
		if next, events, ok := registry.Expired(*p, now); ok {
			s.put(next, events)
			ids = append(ids, id)
		} else if next, events, ok := registry.ExpireHeal(*p, now, s.cfg.Heal); ok {
			s.put(next, events)
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	if len(ids) > 0 {
		s.publish(ids...)
	}
	return len(ids), nil
}

// GrantLeaseGrace implements registry.Store. The peers keep their state and
// events: a grace is not a heartbeat.
func (s *Store) GrantLeaseGrace(_ context.Context, now time.Time) (int, error) {
	until := now.UTC().Truncate(time.Microsecond).Add(s.cfg.LeaseTTL)
	s.mu.Lock()
	var ids []string
	for id, p := range s.byID {
		if registry.HoldsLease(p.State) && p.LeaseExpiry.Before(until) {
			p.LeaseExpiry = until
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	if len(ids) > 0 {
		s.publish(ids...)
	}
	return len(ids), nil
}

// Events implements registry.Store.
func (s *Store) Events(_ context.Context, q registry.EventQuery) ([]registry.Event, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	out := []registry.Event{}
	match := func(e *registry.Event) bool { return q.PeerID == "" || e.PeerID == q.PeerID }
	if q.After > 0 {
		i := sort.Search(len(s.events), func(i int) bool { return s.events[i].ID > q.After })
		for ; i < len(s.events) && len(out) < limit; i++ {
			if match(&s.events[i]) {
				out = append(out, s.events[i])
			}
		}
		return out, nil
	}
	for i := len(s.events) - 1; i >= 0 && len(out) < limit; i-- {
		e := &s.events[i]
		if (q.Before == 0 || e.ID < q.Before) && match(e) {
			out = append(out, *e)
		}
	}
	return out, nil
}

// Subscribe implements registry.Store.
func (s *Store) Subscribe(ctx context.Context) <-chan registry.Change { return s.bc.Subscribe(ctx) }

// Ping implements registry.Store; the embedded store is always there.
func (s *Store) Ping(context.Context) error { return nil }

// Close implements registry.Store.
func (s *Store) Close() {}
