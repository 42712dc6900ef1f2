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
