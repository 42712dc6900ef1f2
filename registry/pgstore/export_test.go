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

// PooledTxStatus reports a pooled connection's transaction status ('I'
// outside a transaction).
func (s *Store) PooledTxStatus(ctx context.Context) (byte, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release()
	return c.Conn().PgConn().TxStatus(), nil
}

// ConnsOpened counts the connections the pool has opened, so a test can
// see that one was kept rather than replaced.
func (s *Store) ConnsOpened() int64 { return s.pool.Stat().NewConnsCount() }
