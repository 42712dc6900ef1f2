package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// healDoc is registry.Heal as the heal column stores it.
type healDoc struct {
	Phase          registry.HealPhase `json:"phase,omitempty"`
	Reason         string             `json:"reason,omitempty"`
	FromGeneration int64              `json:"from_generation,omitempty"`
	Started        *time.Time         `json:"started,omitempty"`
	Acted          *time.Time         `json:"acted,omitempty"`
	Deadline       *time.Time         `json:"deadline,omitempty"`
	Recent         []time.Time        `json:"recent,omitempty"`
	Pairs          []string           `json:"pairs,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func timeOf(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func encodeHeal(h registry.Heal) []byte {
	b, err := json.Marshal(healDoc{
		Phase: h.Phase, Reason: h.Reason, FromGeneration: h.FromGeneration,
		Started: timePtr(h.Started), Acted: timePtr(h.Acted), Deadline: timePtr(h.Deadline), Recent: h.Recent,
		Pairs: h.Pairs,
	})
	if err != nil {
		panic(fmt.Sprintf("encode heal plan: %v", err)) // strings, ints and times always encode
	}
	return b
}

// readHeal is decodeHeal for the batch statements (heartbeats, the lease
// sweep): a plan it cannot read is logged and read as none, so that one
// damaged row starts its peer's heal over instead of failing every other
// peer's heartbeat in the batch, or the whole sweep.
func (s *Store) readHeal(id string, b []byte) registry.Heal {
	h, err := decodeHeal(b)
	if err != nil {
		s.log.Warn().Err(err).Str("peer", id).Msg("unreadable heal plan; read as none")
	}
	return h
}

func decodeHeal(b []byte) (registry.Heal, error) {
	if len(b) == 0 {
		return registry.Heal{}, nil
	}
	var d healDoc
	if err := json.Unmarshal(b, &d); err != nil {
		return registry.Heal{}, err
	}
	h := registry.Heal{Phase: d.Phase, Reason: d.Reason, FromGeneration: d.FromGeneration,
		Started: timeOf(d.Started), Acted: timeOf(d.Acted), Deadline: timeOf(d.Deadline), Pairs: d.Pairs}
	for _, t := range d.Recent {
		h.Recent = append(h.Recent, t.UTC())
	}
	return h, nil
}

// healStep is a healing peer's heartbeat applied by the Go rule: the batch
// statement leaves stale peers' state alone, and never moves a heal plan;
// the few peers whose plan or stale state moves are written here, in the
// batch's transaction.
type healStep struct {
	prev, next registry.Peer
	events     []registry.Event
}

// writeHealSteps writes the steps whose plan or state moved: the IDs of
// the peers they changed, and the peers they made stale (a hold that ran
// out: drained), whose hints go before the batch's notification.
func (s *Store) writeHealSteps(ctx context.Context, tx pgx.Tx, steps []healStep, now time.Time) (ids []string, stale []registry.Peer, err error) {
	for i := range steps {
		st := &steps[i]
		if st.next.State == st.prev.State && st.next.StateReason == st.prev.StateReason &&
			string(encodeHeal(st.next.Heal)) == string(encodeHeal(st.prev.Heal)) {
			continue
		}
		tag, err := tx.Exec(ctx, `UPDATE peers SET state = $2, state_reason = $3, heal = $4, updated_at = $5
			WHERE id = $1 AND (state = 'stale' OR heal ->> 'phase' = 'quarantined')`, st.next.ID, st.next.State, st.next.StateReason, encodeHeal(st.next.Heal), now)
		if err != nil {
			return nil, nil, err
		}
		if tag.RowsAffected() == 0 {
			continue
		}
		if err := s.appendEvents(ctx, tx, &st.next, st.events, now); err != nil {
			return nil, nil, err
		}
		ids = append(ids, st.next.ID)
		if becameStale(&st.prev, &st.next) {
			stale = append(stale, st.next)
		}
	}
	return ids, stale, nil
}

// expireHeals moves the heal plans whose step ran out of time
// (registry.ExpireHeal: a hold that is over, a heal that did not verify),
// within the sweep's transaction. Only plans that can move are read and
// locked: a hold is over only for a peer that holds a lease
// (registry.HoldsLease), so the plan a failed peer keeps until it comes
// back is not locked again by every sweep. A row another transaction
// holds is skipped, as ExpireLeases skips it: the sweep, which holds the
// sweeper's lock, does not stall on it, and the next sweep looks again. It
// returns the IDs of the peers it changed and the peers it made stale, as
// writeHealSteps does.
func (s *Store) expireHeals(ctx context.Context, tx pgx.Tx, now time.Time) (ids []string, stale []registry.Peer, err error) {
	rows, err := tx.Query(ctx, `SELECT id::text, name, generation, state, state_reason, heal FROM peers
		WHERE (state = 'stale' AND heal ->> 'phase' = 'verifying')
			OR (heal ->> 'phase' = 'quarantined' AND state IN `+holdsLeaseStates+`)
		ORDER BY id FOR NO KEY UPDATE SKIP LOCKED`)
	if err != nil {
		return nil, nil, err
	}
	type cand struct {
		p    registry.Peer
		heal []byte
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
		var c cand
		err := r.Scan(&c.p.ID, &c.p.Name, &c.p.Generation, &c.p.State, &c.p.StateReason, &c.heal)
		return c, err
	})
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cands {
		c.p.Heal = s.readHeal(c.p.ID, c.heal)
		next, events, ok := registry.ExpireHeal(c.p, now, s.cfg.Heal)
		if !ok {
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE peers SET state = $2, state_reason = $3, heal = $4, updated_at = $5 WHERE id = $1`,
			next.ID, next.State, next.StateReason, encodeHeal(next.Heal), now); err != nil {
			return nil, nil, err
		}
		if err := s.appendEvents(ctx, tx, &next, events, now); err != nil {
			return nil, nil, err
		}
		ids = append(ids, next.ID)
		if becameStale(&c.p, &next) {
			stale = append(stale, next)
		}
	}
	return ids, stale, nil
}
