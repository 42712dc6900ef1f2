package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// Loads implements registry.Store: one narrow scan of the columns the
// heartbeats write, cheap enough for every replica to run each heartbeat
// interval.
func (s *Store) Loads(ctx context.Context) ([]registry.PeerLoad, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, load_running, load_queued, load_kv_usage, last_heartbeat
		FROM peers WHERE last_heartbeat IS NOT NULL`)
	if err != nil {
		return nil, classify(err, "read loads")
	}
	loads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (registry.PeerLoad, error) {
		var l registry.PeerLoad
		var at time.Time
		err := r.Scan(&l.PeerID, &l.Load.Running, &l.Load.Queued, &l.Load.KVUsage, &at)
		l.At = at.UTC()
		return l, err
	})
	return loads, classify(err, "read loads")
}
