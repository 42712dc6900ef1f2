package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// BenchmarkHeartbeatLevers measures batched heartbeat rows/s over one
// fleet of 10,000 peers with each lever of the batch writer moved on its
// own, so that their ratios come from one run on one database: how many
// batches are written at once, whether a batch's commit waits for the WAL
// flush (durable) or not (the default, see heartbeatTx), the batch size
// the linger window, and the lease index that kept every heartbeat from
// being a heap-only update. "before" is the writer as it was: one batch at a
// time, durable commits. Run it against a PostgreSQL with
// synchronous_commit on (the server default): the test script's server
// turns it off for every transaction, which hides that lever.
func BenchmarkHeartbeatLevers(b *testing.B) {
	ctx := context.Background()
	base, cfg := registrytest.NewPGStore(b, pgstore.Config{})
	peers := registerFleet(b, ctx, base, 10_000)
	base.Close()
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	const leaseIndex = `CREATE INDEX peers_lease_idx ON peers (lease_expiry)
		WHERE state IN ('pending', 'ready', 'stale', 'unhealthy')`
	durable := func(c *pgstore.Config) { *c = pgstore.WithDurableHeartbeats(*c) }
	levers := []struct {
		name  string
		index bool // the lease index dropped by migration 009_heartbeat_hot_updates
		set   func(c *pgstore.Config)
	}{
		{"before:writers=1,durable,lease-index", true, func(c *pgstore.Config) { c.HeartbeatWriters = 1; durable(c) }},
		{"writers=1,durable", false, func(c *pgstore.Config) { c.HeartbeatWriters = 1; durable(c) }},
		{"writers=1", false, func(c *pgstore.Config) { c.HeartbeatWriters = 1 }},
		{"writers=2,durable", false, func(c *pgstore.Config) { c.HeartbeatWriters = 2; durable(c) }},
		{"after:writers=2", false, func(c *pgstore.Config) { c.HeartbeatWriters = 2 }},
		{"writers=2,lease-index", true, func(c *pgstore.Config) { c.HeartbeatWriters = 2 }},
		{"writers=4", false, func(c *pgstore.Config) { c.HeartbeatWriters = 4 }},
		{"writers=2,batch=500", false, func(c *pgstore.Config) { c.HeartbeatWriters, c.HeartbeatBatch = 2, 500 }},
		{"writers=2,batch=5000", false, func(c *pgstore.Config) { c.HeartbeatWriters, c.HeartbeatBatch = 2, 5000 }},
		{"writers=2,linger=10ms", false, func(c *pgstore.Config) { c.HeartbeatWriters, c.HeartbeatLinger = 2, 10*time.Millisecond }},
	}
	for _, l := range levers {
		b.Run(l.name, func(b *testing.B) {
			// Every lever starts from the same compact table.
			prepare := []string{"DROP INDEX IF EXISTS peers_lease_idx", "VACUUM FULL peers"}
			if l.index {
				prepare = append(prepare, leaseIndex)
			}
			for _, q := range prepare {
				if _, err := pool.Exec(ctx, q); err != nil {
					b.Fatalf("%s: %v", q, err)
				}
			}
			c := cfg
			l.set(&c)
			s := registrytest.OpenPGStore(b, c)
			b.ResetTimer()
			driveHeartbeats(b, s, peers)
		})
	}
	reportHOT(b, pool)
}

// reportHOT logs how many of the peers table's updates were heap-only
// (no index entry written): a heartbeat that changes an indexed column
// can never be one.
func reportHOT(b *testing.B, pool *pgxpool.Pool) {
	var upd, hot int64
	err := pool.QueryRow(context.Background(), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
		WHERE relid = 'peers'::regclass`).Scan(&upd, &hot)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("peers: %d updates, %d heap-only (%.0f%%)", upd, hot, 100*float64(hot)/float64(max(upd, 1)))
}
