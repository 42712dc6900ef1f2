package registry

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// The lease rule. A lease expires only on evidence: a peer is marked failed
// when its agent could have renewed the lease and did not. Two things make
// the absence of heartbeats say nothing about the peer:
//
//   - the store could not record heartbeats (PostgreSQL stopped, restarting,
//     or unreachable from this replica): every heartbeat in that time was
//     answered 503 and is lost, whatever the agents did;
//   - the replica was not running (it just started, or its process was
//     frozen): agents pointing at it were refused or backing off.
//
// So after each of these, every live lease gets a grace of one full TTL from
// the moment heartbeats can be written again: its expiry becomes
// max(lease_expiry, writable_since + TTL). The sweeper owns the rule. It
// notices the outage itself (a sweep that fails, a start, a gap between its
// ticks), and on its first sweep that reaches the store again it asks the
// store to extend every live lease (Store.GrantLeaseGrace) instead of
// sweeping; the grace is written into the leases, so every replica honours
// it whichever one sweeps next.
//
// With N replicas sharing PostgreSQL, every replica runs a sweeper and the
// store lets one at a time expire leases (an advisory lock). A database
// outage longer than a sweep interval fails every replica's sweep, so each
// grants the grace when it reaches the database again, before it sweeps; the
// grants are idempotent (lease_expiry only grows). An outage shorter than an
// interval costs agents less than an interval of a TTL that spans several
// heartbeats, so it cannot expire a lease that heartbeats would have kept.
// A replica that alone loses the database answers its agents 503 and they
// fail over to a replica that can write (agents take every replica's URL,
// or a name that resolves to each, and move on at a 503): those
// peers' leases keep being renewed, and peers whose agents reach no working
// replica at all for a full TTL after the grace do expire.
//
// The embedded store is never unwritable while its process runs, and a
// restart empties it (agents re-register on the 404 their next heartbeat
// gets, with a fresh lease), so for it only a frozen process matters; the
// same grant covers it.

// SweeperConfig configures a LeaseSweeper.
type SweeperConfig struct {
	// LeaseTTL is the stores' lease; when Interval is unset it is a tenth
	// of it, at most a second, so that a lease ends within a tenth of its
	// length of when it should.
	LeaseTTL time.Duration
	// Interval is how often the sweeper looks for expired leases.
	Interval time.Duration
	// PauseAfter is the gap between two sweeps after which the sweeper
	// concludes that its process was not running (frozen, starved) and
	// could not have taken heartbeats, and grants a grace. Unset, it is
	// three intervals or half the lease, whichever is longer.
	PauseAfter time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// WithDefaults fills in unset fields.
func (c SweeperConfig) WithDefaults() SweeperConfig {
	if c.Interval == 0 {
		c.Interval = time.Second
		if c.LeaseTTL > 0 {
			c.Interval = min(c.Interval, c.LeaseTTL/10)
		}
	}
	if c.PauseAfter == 0 {
		// A gap shorter than half a lease cannot by itself expire a peer
		// that heartbeats several times a lease, and a short threshold on
		// a loaded machine would keep granting graces to dead peers.
		c.PauseAfter = max(3*c.Interval, c.LeaseTTL/2)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c SweeperConfig) validate() error {
	switch {
	case c.Interval <= 0:
		return fmt.Errorf("sweeper interval must be positive, got %s", c.Interval)
	case c.PauseAfter <= c.Interval:
		return fmt.Errorf("sweeper pause-after %s must exceed its interval %s", c.PauseAfter, c.Interval)
	}
	return nil
}

// LeaseSweeper marks peers whose heartbeats stopped as failed, applying the
// lease rule above.
type LeaseSweeper struct {
	cfg   SweeperConfig
	store Store
	log   zerolog.Logger

	// owed: evidence was lost since the last grant; the next sweep that
	// reaches the store grants a grace instead of expiring. A new sweeper
	// owes one: the replica just started.
	owed bool
	last time.Time
}

// NewLeaseSweeper returns a sweeper over store; Run drives it.
func NewLeaseSweeper(cfg SweeperConfig, store Store, log zerolog.Logger) (*LeaseSweeper, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &LeaseSweeper{cfg: cfg, store: store, log: log, owed: true}, nil
}

// Run sweeps every interval until ctx ends.
func (s *LeaseSweeper) Run(ctx context.Context) {
	everyTick(ctx, s.cfg.Interval, func(ctx context.Context) {
		n, err := s.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn().Err(err).Msg("sweep expired leases; every live lease gets a grace once the store answers")
		case n > 0:
			s.log.Info().Int("peers", n).Msg("leases expired; peers marked failed")
		}
	})
}

// everyTick calls fn every interval, the first time one interval from now,
// until ctx ends; a call that runs long delays the next tick rather than
// queueing ticks. The sweepers' Run loops share it.
func everyTick(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn(ctx)
	}
}

// Sweep runs one sweep: it grants the grace when one is owed, and otherwise
// marks the peers whose lease ended as failed and returns how many.
// Sweeps must not run concurrently; Run calls it once per interval.
func (s *LeaseSweeper) Sweep(ctx context.Context) (int, error) {
	now := s.cfg.Now()
	if !s.last.IsZero() && now.Sub(s.last) > s.cfg.PauseAfter {
		s.log.Warn().Dur("gap", now.Sub(s.last)).Msg("the sweeper did not run for a while; granting every lease a grace")
		s.owed = true
	}
	s.last = now
	if s.owed {
		n, err := s.store.GrantLeaseGrace(ctx, now)
		if err != nil {
			return 0, fmt.Errorf("grant lease grace: %w", err)
		}
		s.owed = false
		s.log.Info().Int("peers", n).Msg("heartbeats can be recorded again; live leases extended by one TTL")
		return 0, nil
	}
	n, err := s.store.ExpireLeases(ctx, now)
	if err != nil {
		// Whatever failed, this sweep collected no evidence, and the
		// heartbeats of the same moment may have failed alike.
		s.owed = true
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	return n, nil
}
