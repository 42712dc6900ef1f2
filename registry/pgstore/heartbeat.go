package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pdplane/pdplane/registry"
)

// heartbeatBatcher gathers concurrent heartbeats and writes each batch with
// one UPDATE over unnest()ed arrays, so 10,000 peers heartbeating every two
// seconds cost a handful of statements a second instead of 5,000. One
// goroutine (gather) fills one batch at a time and hands it to the first
// free of HeartbeatWriters writers; while every writer is busy the batch
// keeps growing, so a busy database gets fewer, larger statements.
type heartbeatBatcher struct {
	s       *Store
	in      chan *hbRequest
	batches chan []*hbRequest
}

type hbRequest struct {
	hb    registry.Heartbeat
	reply registry.HeartbeatReply
	err   error
	done  chan struct{}
}

func newHeartbeatBatcher(s *Store) *heartbeatBatcher {
	return &heartbeatBatcher{s: s, in: make(chan *hbRequest, s.cfg.HeartbeatBatch), batches: make(chan []*hbRequest)}
}

// Heartbeat implements registry.Store by joining the next batch. A heartbeat
// that breaks the field limits never joins one.
func (s *Store) Heartbeat(ctx context.Context, hb registry.Heartbeat) (registry.HeartbeatReply, error) {
	if err := hb.Validate(); err != nil {
		return registry.HeartbeatReply{}, err
	}
	return s.joinBatch(ctx, hb)
}

func (s *Store) joinBatch(ctx context.Context, hb registry.Heartbeat) (registry.HeartbeatReply, error) {
	req := &hbRequest{hb: hb, done: make(chan struct{})}
	select {
	case s.hb.in <- req:
	case <-ctx.Done():
		return registry.HeartbeatReply{}, ctx.Err()
	}
	select {
	case <-req.done:
		return req.reply, req.err
	case <-ctx.Done():
		return registry.HeartbeatReply{}, ctx.Err()
	}
}

// A batch of fewer than fillTo heartbeats lingers up to lingerSmall times
// HeartbeatLinger rather than once: a fleet's steady trickle (10,000 peers
// every 2 s across three replicas is under two heartbeats a millisecond
// each) is then written in tens of statements a second rather than
// hundreds, each a transaction for PostgreSQL, while a burst, or a fleet
// large enough to fill fillTo within one linger, is written as soon as
// before.
const (
	fillTo      = 64
	lingerSmall = 10
)

// gather fills batches until ctx ends, one at a time: each from its first
// heartbeat until its linger has passed (see fillTo) and a writer is free,
// or until it is full and a writer is free.
func (b *heartbeatBatcher) gather(ctx context.Context) {
	max := b.s.cfg.HeartbeatBatch
	for {
		var batch []*hbRequest
		select {
		case <-ctx.Done():
			b.drain(nil, ctx.Err())
			return
		case r := <-b.in:
			batch = append(make([]*hbRequest, 0, min(max, fillTo)), r)
		}
		// The timer fires after one linger, then after the rest of
		// lingerSmall of them.
		linger := time.NewTimer(b.s.cfg.HeartbeatLinger)
		fired := 0
		var out chan<- []*hbRequest // nil until the batch may go
		for handed := false; !handed; {
			in := b.in
			if len(batch) >= max {
				in, out = nil, b.batches // full: only handing it over is left
			} else if fired == 2 || fired == 1 && len(batch) >= fillTo {
				out = b.batches
			}
			select {
			case <-ctx.Done():
				linger.Stop()
				b.drain(batch, ctx.Err())
				return
			case r := <-in:
				batch = append(batch, r)
			case <-linger.C:
				if fired++; fired == 1 {
					linger.Reset((lingerSmall - 1) * b.s.cfg.HeartbeatLinger)
				}
			case out <- batch:
				handed = true
			}
		}
		linger.Stop()
	}
}

// write writes the batches gather hands it until ctx ends.
func (b *heartbeatBatcher) write(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case batch := <-b.batches:
			b.flush(ctx, batch)
		}
	}
}

// drain answers with err the heartbeats held in a batch and those still
// waiting to join one.
func (b *heartbeatBatcher) drain(held []*hbRequest, err error) {
	for _, r := range held {
		r.err = err
		close(r.done)
	}
	for {
		select {
		case r := <-b.in:
			r.err = err
			close(r.done)
		default:
			return
		}
	}
}

// flush writes one batch and answers every request in it. When the database
// refuses the batch statement, one row may be to blame and must not fail the
// others: each heartbeat is then written alone and gets its own answer.
func (b *heartbeatBatcher) flush(ctx context.Context, batch []*hbRequest) {
	replies, err := b.s.writeHeartbeats(ctx, batch)
	if err != nil && len(batch) > 1 && rowMayBeToBlame(err) {
		b.s.log.Warn().Err(err).Int("heartbeats", len(batch)).Msg("heartbeat batch refused; writing its rows one by one")
		for _, r := range batch {
			replies, err := b.s.writeHeartbeats(ctx, []*hbRequest{r})
			answer(r, replies, err)
		}
		return
	}
	for _, r := range batch {
		answer(r, replies, err)
	}
}

func answer(r *hbRequest, replies map[string]registry.HeartbeatReply, err error) {
	if err != nil {
		r.err = classify(err, "write heartbeat of peer "+r.hb.PeerID)
	} else if rep, ok := replies[r.hb.PeerID]; ok {
		r.reply = rep
	} else {
		r.err = fmt.Errorf("heartbeat of peer %s: %w", r.hb.PeerID, registry.ErrNotFound)
	}
	close(r.done)
}

// rowMayBeToBlame reports whether a failed batch is worth retrying row by
// row: the server refused the statement for something other than its own
// trouble (a lost connection, no resources, shutting down), which would
// fail every row alike.
func rowMayBeToBlame(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "53", "57", "58": // connection, resources, operator intervention, system
		return false
	}
	return true
}

// writeHeartbeats runs the batch statement and returns the driver's error
// unclassified, so that flush can tell what failed. The prev CTE locks the
// rows in id order, so concurrent batches from several replicas cannot
// deadlock, and returns each peer's state before the update; the answer is
// computed from it with the same rule (registry.ApplyHeartbeat) the
// in-memory store uses.
func (s *Store) writeHeartbeats(ctx context.Context, batch []*hbRequest) (map[string]registry.HeartbeatReply, error) {
	last := map[string]*hbRequest{} // a peer heartbeating twice in one batch: the later one wins
	for _, r := range batch {
		last[r.hb.PeerID] = r
	}
	ids := make([]string, 0, len(last))
	for id := range last {
		if registry.IsPeerID(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	n := len(ids)
	instances, running, queued, usage := make([]string, n), make([]int32, n), make([]int32, n), make([]float64, n)
	// Heartbeats share a few transition tables (one per engine verdict);
	// each row names its table by index, so PostgreSQL parses each once.
	var tables []string
	tableIdx, trans := map[[2]string]int32{}, make([]int32, n)
	for i, id := range ids {
		hb := last[id].hb
		instances[i], running[i], queued[i], usage[i] = hb.InstanceID, int32(hb.Load.Running), int32(hb.Load.Queued), hb.Load.KVUsage
		key := [2]string{fmt.Sprint(hb.EngineDown), hb.EngineError}
		ti, ok := tableIdx[key]
		if !ok {
			ti = int32(len(tables)) + 1 // PostgreSQL arrays count from 1
			tableIdx[key] = ti
			tables = append(tables, transitions(hb))
		}
		trans[i] = ti
	}
	now := s.now()
	replies := make(map[string]registry.HeartbeatReply, n)
	if n == 0 {
		return replies, nil
	}
	err := pgx.BeginTxFunc(ctx, s.pool, s.heartbeatTx(), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
WITH hb AS (
	SELECT * FROM unnest($1::text[]::uuid[], $2::text[], $3::int[], $4::int[], $5::float8[], $8::int[])
		AS t(id, instance_id, running, queued, kv_usage, trans)
), prev AS (
	SELECT p.id, p.name, p.state, p.state_reason, p.instance_id, p.generation, p.heal,
		CASE WHEN hb.instance_id = p.instance_id AND (p.state <> 'failed' OR p.state_reason = $10)
			THEN ($9::jsonb[])[hb.trans] -> p.state END AS t
	FROM peers p JOIN hb USING (id) ORDER BY p.id FOR NO KEY UPDATE OF p
), upd AS (
	UPDATE peers p SET
		load_running = hb.running, load_queued = hb.queued, load_kv_usage = hb.kv_usage,
		last_heartbeat = $6, lease_expiry = $7,
		state = COALESCE(prev.t ->> 'state', p.state),
		state_reason = COALESCE(prev.t ->> 'reason', p.state_reason),
		updated_at = CASE WHEN prev.t IS NULL THEN p.updated_at ELSE $6 END
	FROM hb JOIN prev USING (id)
	WHERE p.id = hb.id
	RETURNING p.id
), ev AS (
	INSERT INTO peer_events (peer_id, peer_name, kind, generation, message, error, at)
	SELECT prev.id, prev.name, prev.t ->> 'kind', prev.generation, prev.t ->> 'message', prev.t ->> 'error', $6
	FROM prev JOIN upd USING (id) WHERE prev.t IS NOT NULL
)
SELECT prev.id::text, prev.name, prev.state, prev.state_reason, prev.instance_id, prev.generation, prev.heal,
	COALESCE(prev.heal ->> 'phase', '') FROM prev`,
			ids, instances, running, queued, usage, now, now.Add(s.cfg.LeaseTTL), trans, tables, registry.ReasonLeaseExpired)
		if err != nil {
			return err
		}
		var changed []string
		var steps []healStep
		var id, name, state, reason, instance string
		var generation int64
		var heal []byte
		var phase string
		_, err = pgx.ForEachRow(rows, []any{&id, &name, &state, &reason, &instance, &generation, &heal, &phase}, func() error {
			prev := registry.Peer{ID: id, State: registry.State(state), StateReason: reason, Generation: generation}
			prev.Name, prev.InstanceID = name, instance
			holding := phase == string(registry.HealQuarantined)
			if prev.State == registry.StateStale || holding {
				// Only a healing peer's heartbeat reads its heal plan:
				// the rest of the batch skips the decode.
				prev.Heal = s.readHeal(id, heal)
			}
			next, reply, events := registry.ApplyHeartbeat(prev, last[id].hb, now, s.cfg.LeaseTTL, s.cfg.Heal)
			replies[id] = reply
			same := instance == last[id].hb.InstanceID
			switch {
			case (prev.State == registry.StateStale || holding && next.Heal.Phase != prev.Heal.Phase) && same:
				// The batch statement left it alone; its heal plan moves
				// here.
				steps = append(steps, healStep{prev: prev, next: next, events: events})
			case next.State != prev.State:
				changed = append(changed, id)
			}
			return nil
		})
		if err != nil {
			return err
		}
		healed, drained, err := s.writeHealSteps(ctx, tx, steps, now)
		if err != nil {
			return err
		}
		changed = append(changed, healed...)
		if len(changed) == 0 {
			return nil
		}
		if err := s.hintStale(ctx, tx, drained); err != nil {
			return err
		}
		return s.notify(ctx, tx, changed...)
	})
	if err != nil {
		return nil, err
	}
	return replies, nil
}

// heartbeatTx begins a heartbeat batch's transaction with
// synchronous_commit off (in the same round trip as BEGIN): its COMMIT
// returns before the WAL reaches disk instead of waiting for the flush,
// the largest cost of a small transaction on a durable database. That is
// safe for heartbeats and only for them: a heartbeat is idempotent and
// every peer sends the next one within the interval, so a crash that
// loses the last few hundred milliseconds of commits loses nothing the
// fleet does not resend, and the database itself stays consistent
// (PostgreSQL never applies a half transaction). The transitions and heal
// steps a batch may also commit are recomputed from the next heartbeat in
// the same way. Writes that are not repeated (registrations, stale marks,
// drains) keep the server's setting.
func (s *Store) heartbeatTx() pgx.TxOptions {
	if s.cfg.durableHeartbeats {
		return pgx.TxOptions{}
	}
	return pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL synchronous_commit = off"}
}

// transition is one entry of a heartbeat's transition table: the state a
// peer moves to from one prior state, and the event that records it.
type transition struct {
	State   registry.State     `json:"state"`
	Reason  string             `json:"reason"`
	Kind    registry.EventKind `json:"kind"`
	Message string             `json:"message"`
	Error   string             `json:"error"`
}

// transitions is hb's transition table as JSON: for every prior state the
// heartbeat changes, what registry.ApplyHeartbeat makes of it. The batch
// statement looks a peer's state up in it, so the rule stays in one place
// while a whole batch is still one statement.
func transitions(hb registry.Heartbeat) string {
	table := map[registry.State]transition{}
	for _, st := range registry.States() {
		prev := registry.Peer{State: st}
		prev.InstanceID = hb.InstanceID
		if st == registry.StateFailed {
			// The table's failed peers are those whose lease ran out; the
			// batch statement leaves a failed heal alone
			// (registry.HealFailed).
			prev.StateReason = registry.ReasonLeaseExpired
		}
		if st == registry.StateStale {
			continue // a stale peer's heal plan is applied per row (writeHealSteps)
		}
		next, _, events := registry.ApplyHeartbeat(prev, hb, time.Time{}, 0, registry.HealConfig{})
		if next.State == st {
			continue
		}
		t := transition{State: next.State, Reason: next.StateReason}
		if len(events) > 0 {
			t.Kind, t.Message, t.Error = events[0].Kind, events[0].Message, events[0].Error
		}
		table[st] = t
	}
	b, err := json.Marshal(table)
	if err != nil {
		panic(fmt.Sprintf("encode heartbeat transitions: %v", err)) // plain strings always encode
	}
	return string(b)
}
