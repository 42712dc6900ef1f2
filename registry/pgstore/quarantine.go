package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

const quarantineColumns = "prefill_id::text, decode_id::text, detail, at, expires_at, trial"

// selectQuarantines reads every quarantine, oldest first (Quarantines,
// Refresh).
const selectQuarantines = "SELECT " + quarantineColumns + " FROM pair_quarantines ORDER BY at"

func scanQuarantine(r pgx.CollectableRow) (registry.Quarantine, error) {
	var q registry.Quarantine
	err := r.Scan(&q.PrefillID, &q.DecodeID, &q.Detail, &q.At, &q.ExpiresAt, &q.Trial)
	q.At = q.At.UTC()
	if q.ExpiresAt != nil {
		t := q.ExpiresAt.UTC()
		q.ExpiresAt = &t
	}
	return q, err
}

// lockQuarantine returns the pair's quarantine, row locked, or nil.
func lockQuarantine(ctx context.Context, tx pgx.Tx, prefillID, decodeID string) (*registry.Quarantine, error) {
	rows, err := tx.Query(ctx, lockQuarantineSQL, prefillID, decodeID)
	if err != nil {
		return nil, err
	}
	return oneQuarantine(rows)
}

const lockQuarantineSQL = "SELECT " + quarantineColumns + " FROM pair_quarantines WHERE prefill_id = $1 AND decode_id = $2 FOR UPDATE"

// oneQuarantine is the pair's quarantine that rows hold, nil when none.
func oneQuarantine(rows pgx.Rows) (*registry.Quarantine, error) {
	q, err := pgx.CollectExactlyOneRow(rows, scanQuarantine)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &q, nil
}

// endQuarantine runs decide on the pair's locked quarantine (nil when
// none) under the decode's row lock; when decide returns events, the
// quarantine is deleted, the events appended to the decode's log, and every
// replica notified.
func (s *Store) endQuarantine(ctx context.Context, prefillID, decodeID, what string, decide func(*registry.Quarantine) ([]registry.Event, error)) error {
	if err := checkID(prefillID, what+" prefill"); err != nil {
		return err
	}
	if err := checkID(decodeID, what+" decode"); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		ds, err := loadPeers(ctx, tx, "WHERE id = $1 FOR UPDATE", decodeID)
		if err != nil {
			return err
		}
		var found bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM peers WHERE id = $1)", prefillID).Scan(&found); err != nil {
			return err
		}
		if len(ds) == 0 || !found {
			return pgx.ErrNoRows
		}
		cur, err := lockQuarantine(ctx, tx, prefillID, decodeID)
		if err != nil {
			return err
		}
		events, err := decide(cur)
		if err != nil || len(events) == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM pair_quarantines WHERE prefill_id = $1 AND decode_id = $2", prefillID, decodeID); err != nil {
			return err
		}
		if err := s.appendEvents(ctx, tx, &ds[0], events, s.now()); err != nil {
			return err
		}
		return s.notify(ctx, tx, decodeID)
	})
	if errors.Is(err, registry.ErrNotFound) {
		return err
	}
	return classify(err, what+" "+prefillID+" → "+decodeID)
}

// LiftQuarantine implements registry.Store.
func (s *Store) LiftQuarantine(ctx context.Context, prefillID, decodeID, by string) error {
	return s.endQuarantine(ctx, prefillID, decodeID, "lift quarantine of pair", func(cur *registry.Quarantine) ([]registry.Event, error) {
		return registry.LiftQuarantine(cur, prefillID, decodeID, by)
	})
}

// ReportTransferSuccess implements registry.Store.
func (s *Store) ReportTransferSuccess(ctx context.Context, prefillID, decodeID, reporter string) (bool, error) {
	var lifted bool
	err := s.endQuarantine(ctx, prefillID, decodeID, "report transfer success of pair", func(cur *registry.Quarantine) ([]registry.Event, error) {
		events, ok := registry.ApplyTrialSuccess(cur, reporter)
		lifted = ok
		return events, nil
	})
	return lifted && err == nil, err
}

// ExpireQuarantines implements registry.Store. Replicas sweeping together
// change each row once: the update re-checks trial on a row another
// transaction just changed.
func (s *Store) ExpireQuarantines(ctx context.Context, now time.Time) (int, error) {
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		qs, err := collectRows(ctx, tx, scanQuarantine, `SELECT `+quarantineColumns+` FROM pair_quarantines
			WHERE NOT trial AND expires_at <= $1 FOR UPDATE SKIP LOCKED`, now.UTC())
		if err != nil || len(qs) == 0 {
			return err
		}
		var ids []string
		for _, q := range qs {
			next, events, changed := registry.ExpireQuarantine(q, now.UTC())
			if !changed {
				continue
			}
			if _, err := tx.Exec(ctx, "UPDATE pair_quarantines SET trial = $3 WHERE prefill_id = $1 AND decode_id = $2",
				q.PrefillID, q.DecodeID, next.Trial); err != nil {
				return err
			}
			ds, err := loadPeers(ctx, tx, "WHERE id = $1", q.DecodeID)
			if err != nil {
				return err
			}
			if len(ds) > 0 {
				if err := s.appendEvents(ctx, tx, &ds[0], events, now.UTC()); err != nil {
					return err
				}
			}
			ids = append(ids, q.DecodeID)
		}
		n = len(ids)
		if n == 0 {
			return nil
		}
		return s.notify(ctx, tx, ids...)
	})
	return n, classify(err, "expire quarantines")
}
