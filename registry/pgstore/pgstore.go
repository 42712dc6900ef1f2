// Package pgstore is the PostgreSQL registry store. Every replica of the
// control plane shares one database: writes are transactions that append
// events and NOTIFY; one listening connection per process turns notifications
// into registry.Changes; heartbeats are batched into one statement per batch;
// the lease sweeper runs under an advisory lock so one replica sweeps at a
// time. All of pdplane's SQL lives in this package.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/migrations"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// Config configures a Store.
type Config struct {
	URL      string
	LeaseTTL time.Duration
	// QuarantineTTL is how long a quarantine lasts before its pair goes on
	// trial; zero keeps quarantines until they are lifted.
	QuarantineTTL time.Duration
	// Channel is the NOTIFY channel; tests give each schema its own.
	Channel string
	// HeartbeatBatch is the most heartbeats written by one statement.
	HeartbeatBatch int
	// HeartbeatLinger is how long the batcher waits for more heartbeats
	// after the first one of a batch arrives; a batch of fewer than 64
	// waits up to ten lingers (see fillTo).
	HeartbeatLinger time.Duration
	// HeartbeatWriters is how many batches may be written at once: while
	// one batch is in the database the next one gathers and is sent, so
	// the batcher is not idle for a round trip and a commit per batch.
	// Default 4, the fastest of 1, 2 and 4 in BenchmarkHeartbeatLevers
	// (registry/BENCHMARKS.md); each holds a pool connection while it
	// writes (see MaxConns).
	HeartbeatWriters int
	// MaxConns sizes the connection pool; default HeartbeatWriters + 2
	// (the heartbeats that wait for a held row, lockedRowWriters) + 4, at
	// least 8, so heartbeat writers leave connections for the mirror, the
	// API (which reads a peer the snapshot does not hold yet) and the
	// sweeper. The URL's pool_max_conns wins.
	MaxConns int32
	// durableHeartbeats makes heartbeat batches commit with the server's
	// synchronous_commit, as every other write does; only benchmarks set it
	// (WithDurableHeartbeats), to measure what heartbeatTx saves.
	durableHeartbeats bool
	// otherPrefillsPage is how many prefills a transfer failure's report
	// reads at a time looking for another that can use the decode
	// (otherPrefills); default 64. Tests make it small.
	otherPrefillsPage int
	// ConnectTimeout bounds each new connection when the URL sets no
	// connect_timeout: with the database's host unreachable (packets
	// dropped, not refused) a call then fails as ErrUnavailable, a 503,
	// instead of waiting for the operating system to give up on the dial.
	ConnectTimeout time.Duration
	// Migrate applies migrations when the store opens.
	Migrate bool
	// Heal times and limits the heal plans of stale peers.
	Heal registry.HealConfig
	Now  func() time.Time
}

// WithDefaults fills in unset fields.
func (c Config) WithDefaults() Config {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = registry.DefaultLeaseTTL
	}
	if c.Channel == "" {
		c.Channel = "pdplane_peers"
	}
	if c.HeartbeatBatch == 0 {
		c.HeartbeatBatch = 2000
	}
	if c.HeartbeatLinger == 0 {
		c.HeartbeatLinger = 2 * time.Millisecond
	}
	if c.HeartbeatWriters == 0 {
		c.HeartbeatWriters = 4
	}
	if c.MaxConns == 0 {
		c.MaxConns = int32(max(8, c.HeartbeatWriters+lockedRowWriters+4))
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.otherPrefillsPage == 0 {
		c.otherPrefillsPage = 64
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	if c.URL == "" {
		return errors.New("database url is required")
	}
	if c.HeartbeatBatch < 1 {
		return fmt.Errorf("heartbeat batch must be at least 1, got %d", c.HeartbeatBatch)
	}
	if c.HeartbeatWriters < 1 {
		return fmt.Errorf("heartbeat writers must be at least 1, got %d", c.HeartbeatWriters)
	}
	if n := len(c.staleChannel()); n > maxChannel {
		return fmt.Errorf("notification channel %q is too long: %s must fit PostgreSQL's %d bytes", c.Channel, c.staleChannel(), maxChannel)
	}
	return nil
}

// maxChannel is the longest channel name PostgreSQL accepts (NAMEDATALEN-1).
const maxChannel = 63

// staleChannel carries the stale hints (registry.Change.Stale) beside
// Channel. A channel of its own, not a new payload format on Channel: a
// replica of an earlier version in a rolling upgrade does not listen to
// it, and reads Channel's payloads as it always has.
func (c Config) staleChannel() string { return c.Channel + "_stale" }

// Store is the PostgreSQL registry.Store.
type Store struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     zerolog.Logger
	bc      replica.Broadcaster
	hb      *heartbeatBatcher
	lockKey int64 // advisory lock of the lease sweeper
	cancel  context.CancelFunc
	done    chan struct{}
}

var _ registry.Store = (*Store)(nil)

// Open connects, migrates when asked, and starts the notification listener
// and the heartbeat batcher. Close stops them.
func Open(ctx context.Context, cfg Config, log zerolog.Logger) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if !strings.Contains(cfg.URL, "pool_max_conns") {
		pcfg.MaxConns = cfg.MaxConns
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	if cfg.Migrate {
		if err := migrateURL(ctx, pcfg.ConnConfig); err != nil {
			return nil, err
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte("pdplane-lease-sweeper:" + cfg.Channel))
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Store{cfg: cfg, pool: pool, log: log, lockKey: int64(h.Sum64()), cancel: cancel, done: make(chan struct{})}
	s.hb = newHeartbeatBatcher(s)
	listening := make(chan error, 1)
	go func() {
		defer close(s.done)
		for range cfg.HeartbeatWriters {
			go s.hb.write(runCtx)
		}
		go s.hb.gather(runCtx)
		s.listen(runCtx, pcfg.ConnConfig, listening)
	}()
	select {
	case err := <-listening:
		if err != nil {
			s.Close()
			return nil, err
		}
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
	return s, nil
}

// Migrate applies the embedded migrations to the database at url.
func Migrate(ctx context.Context, url string) error {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	return migrateURL(ctx, cc)
}

func migrateURL(ctx context.Context, cc *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("connect for migration: %w", err)
	}
	defer conn.Close(context.Background())
	if _, _, err := migrations.Migrate(ctx, conn); err != nil {
		return err
	}
	return nil
}

// Close stops the listener and batcher and closes the pool.
func (s *Store) Close() {
	s.cancel()
	<-s.done
	s.pool.Close()
}

// Ping implements registry.Store.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// Subscribe implements registry.Store.
func (s *Store) Subscribe(ctx context.Context) <-chan registry.Change { return s.bc.Subscribe(ctx) }

func (s *Store) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// notify queues a change notification in tx; PostgreSQL delivers it to every
// listener, this process's too, when tx commits.
func (s *Store) notify(ctx context.Context, tx pgx.Tx, ids ...string) error {
	_, err := tx.Exec(ctx, notifySQL, s.cfg.Channel, encodeIDs(ids))
	return err
}

// queueNotify queues the notification of notify in a batch.
func (s *Store) queueNotify(b *pgx.Batch, ids ...string) {
	b.Queue(notifySQL, s.cfg.Channel, encodeIDs(ids))
}

// queueChange queues, in a batch, the notification that peer next (prev
// before) changed, preceded, when the change made it stale, by the stale
// hint (staleChannel): the other replicas take the peer out of their
// routes on the hint, before the notification's read of it answers.
func (s *Store) queueChange(b *pgx.Batch, prev, next *registry.Peer) {
	if becameStale(prev, next) {
		b.Queue(notifySQL, s.cfg.staleChannel(), encodeStaleHint(next.ID, next.Generation))
	}
	s.queueNotify(b, next.ID)
}

// becameStale is the rule for a stale hint: the change took the peer out
// of routing as stale.
func becameStale(prev, next *registry.Peer) bool {
	return next.State == registry.StateStale && prev.State != registry.StateStale
}

// hintStale sends the stale hints of peers in tx, in one statement, which
// must send the notification of their change after them (see
// queueChange): for the writes that change several peers at once (a
// heartbeat batch, the lease sweep).
func (s *Store) hintStale(ctx context.Context, tx pgx.Tx, peers []registry.Peer) error {
	if len(peers) == 0 {
		return nil
	}
	hints := make([]string, len(peers))
	for i := range peers {
		hints[i] = encodeStaleHint(peers[i].ID, peers[i].Generation)
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, hint) FROM unnest($2::text[]) WITH ORDINALITY AS h(hint, i) ORDER BY i`,
		s.cfg.staleChannel(), hints)
	return err
}

const notifySQL = "SELECT pg_notify($1, $2)"

// classify turns driver errors into registry error classes.
func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, registry.ErrNotFound)
	}
	if unreachable(err) {
		return fmt.Errorf("%s: %w: %w", what, registry.ErrUnavailable, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505":
			return fmt.Errorf("%s: %w: %s", what, registry.ErrConflict, pgErr.Detail)
		case "22P02": // invalid text representation, e.g. a malformed uuid
			return fmt.Errorf("%s: %w", what, registry.ErrNotFound)
		case "55P03": // lock_not_available: another transaction held the row past lock_timeout
			return fmt.Errorf("%s: %w: the peer's row is held by another transaction", what, registry.ErrUnavailable)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// unreachable reports whether err says the database could not be reached or
// went away under the request, as opposed to refusing the request itself:
// a failed connection attempt (refused, reset, the server starting up or
// shutting down), a connection exception (SQLSTATE class 08), an operator or
// crash shutdown (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now), too many connections (53300), or a connection that
// broke mid-statement.
func unreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"),
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03",
			pgErr.Code == "53300":
			return true
		}
		var connErr *pgconn.ConnectError
		return errors.As(err, &connErr) // e.g. 57P03 while connecting
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connErr), errors.As(err, &netErr),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}
