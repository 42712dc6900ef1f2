package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

const preflightColumns = "prefill_id::text, decode_id::text, state, backend, mem_kind, gbps, latency_us, checked_at, error, prefill_generation, decode_generation"

func scanPreflight(r pgx.CollectableRow) (registry.Preflight, error) {
	var pf registry.Preflight
	var kind int16
	err := r.Scan(&pf.PrefillID, &pf.DecodeID, &pf.State, &pf.Backend, &kind, &pf.GBps, &pf.LatencyUS,
		&pf.CheckedAt, &pf.Error, &pf.PrefillGeneration, &pf.DecodeGeneration)
	pf.MemKind = registry.MemKind(kind)
	pf.CheckedAt = pf.CheckedAt.UTC()
	return pf, err
}

// ReportPreflight implements registry.Store: one upsert that stamps both
// peers' current generations, and a notification, in one transaction.
func (s *Store) ReportPreflight(ctx context.Context, pf registry.Preflight) (registry.Preflight, error) {
	if err := registry.ValidatePreflight(pf); err != nil {
		return registry.Preflight{}, err
	}
	var out registry.Preflight
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
INSERT INTO pair_preflights (prefill_id, decode_id, state, backend, mem_kind, gbps, latency_us, checked_at, error, prefill_generation, decode_generation)
SELECT p.id, d.id, $3, $4, $5, $6, $7, $8, $9, p.generation, d.generation
FROM peers p, peers d WHERE p.id = $1 AND d.id = $2
ON CONFLICT (prefill_id, decode_id) DO UPDATE SET
    state = EXCLUDED.state, backend = EXCLUDED.backend, mem_kind = EXCLUDED.mem_kind,
    gbps = EXCLUDED.gbps, latency_us = EXCLUDED.latency_us, checked_at = EXCLUDED.checked_at,
    error = EXCLUDED.error, prefill_generation = EXCLUDED.prefill_generation,
    decode_generation = EXCLUDED.decode_generation
RETURNING `+preflightColumns,
			pf.PrefillID, pf.DecodeID, string(pf.State), pf.Backend, int16(pf.MemKind), pf.GBps, pf.LatencyUS,
			pf.CheckedAt.UTC(), pf.Error)
		if err != nil {
			return err
		}
		if out, err = pgx.CollectExactlyOneRow(rows, scanPreflight); err != nil {
			return err
		}
		return s.notify(ctx, tx, pf.PrefillID, pf.DecodeID)
	})
	return out, classify(err, "report preflight of pair "+pf.PrefillID+" -> "+pf.DecodeID)
}

// Preflights implements registry.Store.
func (s *Store) Preflights(ctx context.Context) ([]registry.Preflight, error) {
	rows, err := s.pool.Query(ctx, "SELECT "+preflightColumns+" FROM pair_preflights")
	if err != nil {
		return nil, classify(err, "list preflights")
	}
	out, err := pgx.CollectRows(rows, scanPreflight)
	return out, classify(err, "list preflights")
}
