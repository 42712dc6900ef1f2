package pgstore

import (
	"context"

	"github.com/pdplane/pdplane/registry"
)

// HeartbeatUnchecked joins the next batch without the field checks that
// Heartbeat makes first, so a test can put a row the database refuses into
// a batch and see that it fails alone.
func (s *Store) HeartbeatUnchecked(ctx context.Context, hb registry.Heartbeat) (registry.HeartbeatReply, error) {
	return s.joinBatch(ctx, hb)
}

// WithDurableHeartbeats makes c's heartbeat batches commit with the
// server's synchronous_commit, so a benchmark can measure what the
// heartbeat transactions' own setting saves.
func WithDurableHeartbeats(c Config) Config {
	c.durableHeartbeats = true
	return c
}

// WithOtherPrefillsPage makes a transfer failure's report read the other
// prefills n at a time, so that a test can make it page.
func WithOtherPrefillsPage(c Config, n int) Config {
	c.otherPrefillsPage = n
	return c
}

// PooledBackend reports the PostgreSQL backend behind a pooled connection
// and its transaction status ('I' outside a transaction), so a test can
// see that a connection was kept rather than replaced.
func (s *Store) PooledBackend(ctx context.Context) (pid uint32, txStatus byte, err error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.Release()
	return c.Conn().PgConn().PID(), c.Conn().PgConn().TxStatus(), nil
}
