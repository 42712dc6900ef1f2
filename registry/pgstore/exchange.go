package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// RecordExchanges implements registry.Store: one statement for the whole
// batch, which announces nothing (the exchanges change with every request
// served; the page reads them when it is asked).
func (s *Store) RecordExchanges(ctx context.Context, xs []registry.Exchange) error {
	if err := registry.ValidateExchanges(xs); err != nil {
		return err
	}
	if len(xs) == 0 {
		return nil
	}
	prefills, decodes, ats := make([]string, len(xs)), make([]string, len(xs)), make([]time.Time, len(xs))
	for i, x := range xs {
		prefills[i], decodes[i], ats[i] = x.PrefillID, x.DecodeID, x.At.UTC()
	}
	// A pair reported twice in one batch keeps its latest time (DISTINCT
	// ON), since ON CONFLICT may not update one row twice.
	_, err := s.pool.Exec(ctx, `
INSERT INTO pair_exchanges (prefill_id, decode_id, at)
SELECT DISTINCT ON (x.p, x.d) x.p, x.d, x.at
FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[]) AS x(p, d, at)
WHERE EXISTS (SELECT 1 FROM peers WHERE id = x.p) AND EXISTS (SELECT 1 FROM peers WHERE id = x.d)
ORDER BY x.p, x.d, x.at DESC
ON CONFLICT (prefill_id, decode_id) DO UPDATE SET at = greatest(pair_exchanges.at, EXCLUDED.at)`,
		prefills, decodes, ats)
	return classify(err, "record exchanges")
}

// Exchanges implements registry.Store.
func (s *Store) Exchanges(ctx context.Context) ([]registry.Exchange, error) {
	out, err := collectRows(ctx, s.pool, func(r pgx.CollectableRow) (registry.Exchange, error) {
		var x registry.Exchange
		err := r.Scan(&x.PrefillID, &x.DecodeID, &x.At)
		x.At = x.At.UTC()
		return x, err
	}, `SELECT prefill_id::text, decode_id::text, at FROM pair_exchanges`)
	return out, classify(err, "list exchanges")
}
