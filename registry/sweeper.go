package registry

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// RunLeaseSweeper marks peers whose heartbeats stopped as failed, every
// interval, until ctx ends. Every replica runs it; the PostgreSQL store lets
// one replica at a time do the work.
func RunLeaseSweeper(ctx context.Context, store Store, interval time.Duration, now func() time.Time, log zerolog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := store.ExpireLeases(ctx, now())
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn().Err(err).Msg("sweep expired leases")
		case n > 0:
			log.Info().Int("peers", n).Msg("leases expired; peers marked failed")
		}
	}
}
