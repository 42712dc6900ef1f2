package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

const preflightColumns = "prefill_id::text, decode_id::text, state, backend, mem_kind, gbps, latency_us, checked_at, error, prefill_generation, decode_generation"

// selectPreflights reads every preflight (Preflights, Refresh).
const selectPreflights = "SELECT " + preflightColumns + " FROM pair_preflights"

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
	out, err := collectRows(ctx, s.pool, scanPreflight, selectPreflights)
	return out, classify(err, "list preflights")
}

const probeColumns = "peer_id::text, agent_name, backend, mem_kind, metadata, addr, len, dev_id, transfer_secret, generation, updated_at"

func scanProbe(r pgx.CollectableRow) (registry.Probe, error) {
	var pr registry.Probe
	var kind int16
	var addr, n, dev int64
	err := r.Scan(&pr.PeerID, &pr.AgentName, &pr.Backend, &kind, &pr.Metadata, &addr, &n, &dev, &pr.TransferSecret, &pr.Generation, &pr.UpdatedAt)
	pr.MemKind, pr.Addr, pr.Len, pr.DevID = registry.MemKind(kind), uint64(addr), uint64(n), uint64(dev)
	pr.UpdatedAt = pr.UpdatedAt.UTC()
	return pr, err
}

// PublishProbe implements registry.Store.
func (s *Store) PublishProbe(ctx context.Context, pr registry.Probe) (registry.Probe, error) {
	if err := registry.ValidateProbe(pr); err != nil {
		return registry.Probe{}, err
	}
	rows, err := s.pool.Query(ctx, `
INSERT INTO peer_probes (peer_id, agent_name, backend, mem_kind, metadata, addr, len, dev_id, transfer_secret, generation, updated_at)
SELECT p.id, $2, $3, $4, $5, $6, $7, $8, $9, p.generation, $10 FROM peers p WHERE p.id = $1
ON CONFLICT (peer_id) DO UPDATE SET
    agent_name = EXCLUDED.agent_name, backend = EXCLUDED.backend, mem_kind = EXCLUDED.mem_kind,
    metadata = EXCLUDED.metadata, addr = EXCLUDED.addr, len = EXCLUDED.len, dev_id = EXCLUDED.dev_id,
    transfer_secret = EXCLUDED.transfer_secret, generation = EXCLUDED.generation, updated_at = EXCLUDED.updated_at
RETURNING `+probeColumns,
		pr.PeerID, pr.AgentName, pr.Backend, int16(pr.MemKind), pr.Metadata, int64(pr.Addr), int64(pr.Len), int64(pr.DevID),
		pr.TransferSecret, s.now())
	if err != nil {
		return registry.Probe{}, classify(err, "publish probe of peer "+pr.PeerID)
	}
	out, err := pgx.CollectExactlyOneRow(rows, scanProbe)
	return out, classify(err, "publish probe of peer "+pr.PeerID)
}

// Probe implements registry.Store.
func (s *Store) Probe(ctx context.Context, peerID string) (registry.Probe, error) {
	if err := checkID(peerID, "probe of peer"); err != nil {
		return registry.Probe{}, err
	}
	rows, err := s.pool.Query(ctx, "SELECT "+probeColumns+" FROM peer_probes WHERE peer_id = $1", peerID)
	if err != nil {
		return registry.Probe{}, classify(err, "probe of peer "+peerID)
	}
	out, err := pgx.CollectExactlyOneRow(rows, scanProbe)
	return out, classify(err, "probe of peer "+peerID)
}
