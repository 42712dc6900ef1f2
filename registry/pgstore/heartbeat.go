package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pdplane/pdplane/registry"
)

// heartbeatBatcher gathers concurrent heartbeats and writes each batch in
// one transaction: one SELECT that locks the batch's rows and one UPDATE
// over unnest()ed arrays that writes them, their events in the same
// statement (the rare heal steps and change notifications add their own),
// so 10,000 peers heartbeating every two seconds cost a handful of
// statements a second instead of 5,000. One
// goroutine (gather) fills one batch at a time and hands it to the first
// free of HeartbeatWriters writers; while every writer is busy the batch
// keeps growing, so a busy database gets fewer, larger statements.
type heartbeatBatcher struct {
	s       *Store
	in      chan *hbRequest
	batches chan []*hbRequest
	// waiters bounds the heartbeats written alone because another
	// transaction held their row (flush): each holds a connection while it
	// waits for the row.
	waiters chan struct{}
}

// lockedRowWriters is how many heartbeats may wait for a row another
// transaction holds at once; the rest wait for one of them to finish,
// without a connection.
const lockedRowWriters = 2

type hbRequest struct {
	// ctx is the caller's: a heartbeat it abandoned while waiting for a
	// held row (waitLocked) stops waiting.
	ctx   context.Context
	hb    registry.Heartbeat
	reply registry.HeartbeatReply
	err   error
	done  chan struct{}
}

func newHeartbeatBatcher(s *Store) *heartbeatBatcher {
	return &heartbeatBatcher{s: s, in: make(chan *hbRequest, s.cfg.HeartbeatBatch), batches: make(chan []*hbRequest),
		waiters: make(chan struct{}, lockedRowWriters)}
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
	req := &hbRequest{ctx: ctx, hb: hb, done: make(chan struct{})}
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
// others: each heartbeat is then written alone and gets its own answer. A
// row that another transaction holds (an operator's, a long stale mark's)
// is skipped, by the batch and by the writes of one row alike, so that the
// others are answered at once, and written alone, waiting for its row
// (waitLocked).
func (b *heartbeatBatcher) flush(ctx context.Context, batch []*hbRequest) {
	replies, held, err := b.s.writeHeartbeats(ctx, batch, true)
	if err != nil && len(batch) > 1 && rowMayBeToBlame(err) {
		b.s.log.Warn().Err(err).Int("heartbeats", len(batch)).Msg("heartbeat batch refused; writing its rows one by one")
		for _, r := range batch {
			replies, held, err := b.s.writeHeartbeats(ctx, []*hbRequest{r}, true)
			b.settle(ctx, r, replies, held, err)
		}
		return
	}
	for _, r := range batch {
		b.settle(ctx, r, replies, held, err)
	}
}

// settle answers r from a write that skipped held rows, or hands it to
// waitLocked when another transaction held its row.
func (b *heartbeatBatcher) settle(ctx context.Context, r *hbRequest, replies map[string]registry.HeartbeatReply, held map[string]bool, err error) {
	if err == nil && held[r.hb.PeerID] {
		go b.waitLocked(ctx, r)
		return
	}
	answer(r, replies, err)
}

// waitLocked writes a heartbeat whose row another transaction held,
// waiting for the row (at most one lease: past it the agent tries again),
// and answers it. It waits, for one of the lockedRowWriters slots and then
// for the row, only while both its caller and the store (ctx) do, so a
// heartbeat the agent abandoned (it tries again after two seconds) drops
// out instead of taking a slot. While its statement waits for the row, the
// row is held and the lease sweeper, which skips held rows, cannot expire
// the peer; once the row is free the heartbeat, already waiting for it,
// extends the lease. While it waits for a slot it holds nothing: if the
// row is freed and the lease runs out meanwhile, a sweep may expire the
// peer, and the heartbeat, when written, brings it back.
func (b *heartbeatBatcher) waitLocked(ctx context.Context, r *hbRequest) {
	wctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	select {
	case b.waiters <- struct{}{}:
	case <-wctx.Done():
		answer(r, nil, wctx.Err())
		return
	}
	defer func() { <-b.waiters }()
	replies, _, err := b.s.writeHeartbeats(wctx, []*hbRequest{r}, false)
	answer(r, replies, err)
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

// writeHeartbeats writes one batch in a transaction and returns the
// driver's error unclassified, so that flush can tell what failed. It
// locks the batch's rows in id order (concurrent batches from several
// replicas cannot deadlock) and reads their state; the rule
// (registry.ApplyHeartbeat, the in-memory store's too) runs once per row,
// here; then one statement stores what it computed for every row (load,
// lease, a state that moved, its events). A healing peer's heartbeat may
// move its heal plan, which writeHealSteps writes.
//
// With skipLocked, a row another transaction holds is left out: not in
// the replies but in held (a peer that does not exist is in neither).
// Without, the write waits for it, up to one lease, and held is nil.
func (s *Store) writeHeartbeats(ctx context.Context, batch []*hbRequest, skipLocked bool) (replies map[string]registry.HeartbeatReply, held map[string]bool, err error) {
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
	now := s.now()
	replies = make(map[string]registry.HeartbeatReply, len(ids))
	if len(ids) == 0 {
		return replies, nil, nil
	}
	lock := "FOR NO KEY UPDATE SKIP LOCKED"
	if !skipLocked {
		lock = "FOR NO KEY UPDATE"
	}
	err = pgx.BeginTxFunc(ctx, s.pool, s.heartbeatTx(!skipLocked), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id::text, name, state, state_reason, instance_id, generation, heal, COALESCE(heal ->> 'phase', '')
			FROM peers WHERE id = ANY($1::text[]::uuid[]) ORDER BY id `+lock, ids)
		if err != nil {
			return err
		}
		var w heartbeatWrite
		var steps []healStep
		var changed []string
		var prev registry.Peer
		var state, phase string
		var heal []byte
		_, err = pgx.ForEachRow(rows, []any{&prev.ID, &prev.Name, &state, &prev.StateReason, &prev.InstanceID, &prev.Generation, &heal, &phase}, func() error {
			prev.State = registry.State(state)
			prev.Heal = registry.Heal{}
			if prev.State == registry.StateStale || phase == string(registry.HealQuarantined) {
				// Only a healing peer's heartbeat reads its heal plan:
				// the rest of the batch skips the decode.
				prev.Heal = s.readHeal(prev.ID, heal)
			}
			hb := last[prev.ID].hb
			next, reply, events := registry.ApplyHeartbeat(prev, hb, now, s.cfg.LeaseTTL, s.cfg.Heal)
			replies[prev.ID] = reply
			healing := prev.State == registry.StateStale || prev.Heal.Phase == registry.HealQuarantined && next.Heal.Phase != prev.Heal.Phase
			if healing && hb.InstanceID == prev.InstanceID {
				// The statement below writes its load and lease only.
				steps = append(steps, healStep{prev: prev, next: next, events: events})
				next.State, next.StateReason, events = prev.State, prev.StateReason, nil
			}
			if w.add(&prev, &next, hb.Load, events) {
				changed = append(changed, prev.ID)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if skipLocked && len(replies) < len(ids) {
			if held, err = heldRows(ctx, tx, ids, replies); err != nil {
				return err
			}
		}
		if len(w.ids) == 0 {
			return nil // no row locked: nothing to write
		}
		if _, err := tx.Exec(ctx, writeHeartbeatRows, w.ids, w.running, w.queued, w.usage, w.state, w.reason, w.moved, now, now.Add(s.cfg.LeaseTTL),
			w.evPeer, w.evName, w.evKind, w.evGeneration, w.evMessage, w.evError); err != nil {
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
		return nil, nil, err
	}
	return replies, held, nil
}

// heldRows returns which of ids, the rows a write that skips held rows
// did not lock (not in locked), exist: another transaction held those.
// The rest are peers that do not exist, answered at once.
func heldRows(ctx context.Context, tx pgx.Tx, ids []string, locked map[string]registry.HeartbeatReply) (map[string]bool, error) {
	var missing []string
	for _, id := range ids {
		if _, ok := locked[id]; !ok {
			missing = append(missing, id)
		}
	}
	rows, err := tx.Query(ctx, `SELECT id::text FROM peers WHERE id = ANY($1::text[]::uuid[])`, missing)
	if err != nil {
		return nil, err
	}
	held := make(map[string]bool, len(missing))
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error { held[id] = true; return nil })
	return held, err
}

// writeHeartbeatRows stores a batch's rows as writeHeartbeats computed
// them, in one statement: each row's load and lease, its state and reason
// where they moved ($7), and the events of the moves. A row's state is set
// to itself otherwise, which keeps the update heap-only (HOT).
const writeHeartbeatRows = `
WITH hb AS (
	SELECT * FROM unnest($1::text[]::uuid[], $2::int[], $3::int[], $4::float8[], $5::text[], $6::text[], $7::bool[])
		AS t(id, running, queued, kv_usage, state, reason, moved)
), upd AS (
	UPDATE peers p SET
		load_running = hb.running, load_queued = hb.queued, load_kv_usage = hb.kv_usage,
		last_heartbeat = $8, lease_expiry = $9,
		state = CASE WHEN hb.moved THEN hb.state ELSE p.state END,
		state_reason = CASE WHEN hb.moved THEN hb.reason ELSE p.state_reason END,
		updated_at = CASE WHEN hb.moved THEN $8 ELSE p.updated_at END
	FROM hb WHERE p.id = hb.id
)
INSERT INTO peer_events (peer_id, peer_name, kind, generation, message, error, at)
SELECT e.peer_id, e.name, e.kind, e.generation, e.message, e.error, $8
FROM unnest($10::text[]::uuid[], $11::text[], $12::text[], $13::bigint[], $14::text[], $15::text[])
	AS e(peer_id, name, kind, generation, message, error)`

// heartbeatWrite gathers a batch's rows as writeHeartbeatRows takes them.
type heartbeatWrite struct {
	ids, state, reason     []string
	running, queued        []int32
	usage                  []float64
	moved                  []bool
	evPeer, evName, evKind []string
	evMessage, evError     []string
	evGeneration           []int64
}

// add is one peer's row: prev as read, next as the rule made it. It
// reports whether the row's state or reason moved.
func (w *heartbeatWrite) add(prev, next *registry.Peer, load registry.Load, events []registry.Event) (moved bool) {
	moved = next.State != prev.State || next.StateReason != prev.StateReason
	w.ids, w.state, w.reason, w.moved = append(w.ids, prev.ID), append(w.state, string(next.State)), append(w.reason, next.StateReason), append(w.moved, moved)
	w.running, w.queued, w.usage = append(w.running, int32(load.Running)), append(w.queued, int32(load.Queued)), append(w.usage, load.KVUsage)
	for _, e := range events {
		w.evPeer, w.evName, w.evKind = append(w.evPeer, prev.ID), append(w.evName, prev.Name), append(w.evKind, string(e.Kind))
		w.evGeneration, w.evMessage, w.evError = append(w.evGeneration, prev.Generation), append(w.evMessage, e.Message), append(w.evError, e.Error)
	}
	return moved
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
//
// A heartbeat that waits for a held row (waitLocked) also sets
// lock_timeout to one lease in the same round trip.
func (s *Store) heartbeatTx(waitForRow bool) pgx.TxOptions {
	begin := "BEGIN"
	if !s.cfg.durableHeartbeats {
		begin += "; SET LOCAL synchronous_commit = off"
	}
	if waitForRow {
		begin += "; SET LOCAL lock_timeout = " + strconv.FormatInt(s.cfg.LeaseTTL.Milliseconds(), 10)
	}
	if begin == "BEGIN" {
		return pgx.TxOptions{}
	}
	return pgx.TxOptions{BeginQuery: begin}
}
