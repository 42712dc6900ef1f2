package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// Register implements registry.Store: one transaction locks the row of the
// name (if any), decides with registry.AuthorizeRegistration, applies
// registry.Reregister or registry.NewPeer, writes the peer (with a fresh
// credential hash when one is issued), its ranks and events, and notifies.
func (s *Store) Register(ctx context.Context, spec registry.PeerSpec, claim registry.Claim) (registry.RegisterResult, error) {
	if err := spec.Validate(); err != nil {
		return registry.RegisterResult{}, err
	}
	var res registry.RegisterResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		now := s.now()
		// Serialise registrations of one name, including the very first,
		// which has no row to lock yet.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", spec.Name); err != nil {
			return err
		}
		prev, err := loadPeers(ctx, tx, "WHERE name = $1 FOR UPDATE", spec.Name)
		if err != nil {
			return err
		}
		var prevPeer *registry.Peer
		if len(prev) > 0 {
			prevPeer = &prev[0]
		}
		issue, err := registry.AuthorizeRegistration(prevPeer, &spec, claim, now)
		if err != nil {
			return err
		}
		if err := checkAgentNames(ctx, tx, &spec, now); err != nil {
			return err
		}
		var next registry.Peer
		var events []registry.Event
		if len(prev) == 0 {
			id, err := newUUID(ctx, tx)
			if err != nil {
				return err
			}
			next, events = registry.NewPeer(id, spec, now, s.cfg.LeaseTTL)
			res.Created = true
		} else {
			var clearQ bool
			next, events, clearQ = registry.Reregister(prev[0], spec, now, s.cfg.LeaseTTL)
			if clearQ {
				for _, table := range []string{"pair_quarantines", "pair_failures"} {
					if _, err := tx.Exec(ctx, "DELETE FROM "+table+" WHERE prefill_id = $1 OR decode_id = $1", next.ID); err != nil {
						return err
					}
				}
			}
			lifted, err := liftHealed(ctx, tx, registry.HealedPairs(prev[0], next), next.ID, next.Generation)
			if err != nil {
				return err
			}
			events = append(events, lifted...)
		}
		if issue {
			if res.Credential, next.CredentialHash, err = registry.NewCredential(next.ID); err != nil {
				return err
			}
		}
		if err := writePeer(ctx, tx, &next, true); err != nil {
			return err
		}
		if err := s.appendEvents(ctx, tx, &next, events, now); err != nil {
			return err
		}
		res.Peer = next
		return s.notify(ctx, tx, next.ID)
	})
	if err != nil {
		return registry.RegisterResult{}, classify(err, "register peer "+spec.Name)
	}
	return res, nil
}

// checkAgentNames applies registry.CheckAgentNames to the live peers in the
// store. It first locks spec's agent names (in order, so that two
// registrations cannot deadlock), so that two peers of other names cannot
// both take one agent name at once.
func checkAgentNames(ctx context.Context, tx pgx.Tx, spec *registry.PeerSpec, now time.Time) error {
	agents := spec.AgentNames()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended(a, 8)) FROM (SELECT DISTINCT unnest($1::text[]) AS a ORDER BY 1) s`, agents); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT r.agent_name, p.name FROM peer_ranks r JOIN peers p ON p.id = r.peer_id
		WHERE r.agent_name = ANY($1::text[]) AND p.name <> $2 AND p.state <> 'failed' AND p.lease_expiry >= $3`, agents, spec.Name, now)
	if err != nil {
		return err
	}
	holders := map[string]string{}
	var agent, name string
	if _, err := pgx.ForEachRow(rows, []any{&agent, &name}, func() error { holders[agent] = name; return nil }); err != nil {
		return err
	}
	return registry.CheckAgentNames(spec, func(agent string) (string, bool) {
		name, ok := holders[agent]
		return name, ok
	})
}

// liftHealed deletes the quarantines of the pairs (prefill, decodeID)
// that a heal ended and returns their events.
func liftHealed(ctx context.Context, tx pgx.Tx, prefills []string, decodeID string, generation int64) ([]registry.Event, error) {
	if len(prefills) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `DELETE FROM pair_quarantines q WHERE q.decode_id = $1 AND q.prefill_id = ANY($2::text[]::uuid[])
		RETURNING q.prefill_id::text, COALESCE((SELECT name FROM peers WHERE id = q.prefill_id), q.prefill_id::text)`,
		decodeID, prefills)
	if err != nil {
		return nil, err
	}
	gone := map[string]string{}
	var id, name string
	if _, err := pgx.ForEachRow(rows, []any{&id, &name}, func() error { gone[id] = name; return nil }); err != nil {
		return nil, err
	}
	var events []registry.Event
	for _, pid := range prefills { // in the plan's order
		if name, ok := gone[pid]; ok {
			events = append(events, registry.HealedLift(name, generation))
		}
	}
	return events, nil
}

// otherPrefills is registry.OtherPrefills over the ready prefills in the
// store that serve decode's model: whether others than exclude may send to
// decode now. The failure rule only asks whether there is one, so the
// prefills are read a page at a time, in ID order, and the first page that
// has one answers (its count): a fleet of thousands of prefills is not
// read whole inside the report's transaction.
func otherPrefills(ctx context.Context, tx queryer, decode *registry.Peer, exclude string, pageSize int) (int, error) {
	if exclude == "" || !registry.IsPeerID(exclude) {
		return 0, nil
	}
	quarantined, err := collectRows(ctx, tx, pgx.RowTo[string], `SELECT prefill_id::text FROM pair_quarantines WHERE decode_id = $1 AND NOT trial`, decode.ID)
	if err != nil {
		return 0, err
	}
	isQuarantined := func(pid string) bool { return slices.Contains(quarantined, pid) }
	after := "00000000-0000-0000-0000-000000000000"
	for {
		page, err := loadPeers(ctx, tx, "WHERE role IN ('prefill', 'both') AND state = 'ready' AND model = $3 AND id <> $1 AND id <> $2 AND id > $4::uuid "+
			"ORDER BY id LIMIT "+strconv.Itoa(pageSize), exclude, decode.ID, decode.Model, after)
		if err != nil {
			return 0, err
		}
		if n := registry.OtherPrefills(decode, exclude, page, isQuarantined); n > 0 || len(page) < pageSize {
			return n, nil
		}
		after = page[len(page)-1].ID
	}
}

func newUUID(ctx context.Context, tx pgx.Tx) (string, error) {
	var id string
	err := tx.QueryRow(ctx, "SELECT gen_random_uuid()::text").Scan(&id)
	return id, err
}

// writePeer upserts the peer row and, when withRanks, replaces its ranks.
func writePeer(ctx context.Context, tx pgx.Tx, p *registry.Peer, withRanks bool) error {
	row, err := newPeerRow(p)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, upsertPeer, peerColumns.fields(&row)...)
	if err != nil || !withRanks {
		return err
	}
	if _, err := tx.Exec(ctx, "DELETE FROM peer_ranks WHERE peer_id = $1", p.ID); err != nil {
		return err
	}
	rows := make([][]any, len(p.Ranks))
	for i := range p.Ranks {
		row := newRankRow(p.ID, &p.Ranks[i])
		rows[i] = rankColumns.fields(&row)
	}
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"peer_ranks"}, rankNames,
		pgx.CopyFromRows(rows))
	return err
}

// appendEvents records p's events in tx, in one round trip.
func (s *Store) appendEvents(ctx context.Context, tx pgx.Tx, p *registry.Peer, events []registry.Event, now time.Time) error {
	if len(events) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	queueEvents(b, p, events, now)
	return tx.SendBatch(ctx, b).Close()
}

// queueEvents queues the inserts of p's events.
func queueEvents(b *pgx.Batch, p *registry.Peer, events []registry.Event, now time.Time) {
	for _, e := range events {
		b.Queue(insertEvent, eventArgs(p, e, now)...)
	}
}

const insertEvent = `INSERT INTO peer_events (peer_id, peer_name, kind, generation, message, error, at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`

func eventArgs(p *registry.Peer, e registry.Event, now time.Time) []any {
	return []any{p.ID, p.Name, e.Kind, p.Generation, e.Message, e.Error, now}
}

// update applies a life-cycle rule to one locked peer, in two round trips
// to PostgreSQL where a pgx transaction takes seven (BEGIN, the row, its
// ranks, the write, the event, the notification, COMMIT): BEGIN goes with
// the locked read, and the writes go with COMMIT. Under load each round
// trip waits for this process and for PostgreSQL's backend to be scheduled
// again: a stale mark took 10 ms at p50 with 10,000 peers heartbeating
// (registry/BENCHMARKS.md).
func (s *Store) update(ctx context.Context, id, what string, f func(registry.Peer, time.Time) (registry.Peer, []registry.Event)) (registry.Peer, error) {
	if err := checkID(id, what+" peer"); err != nil {
		return registry.Peer{}, err
	}
	var out registry.Peer
	err := s.byHand(ctx, func(t handTx) (err error) {
		out, err = s.lockedUpdate(ctx, t, id, f)
		return err
	})
	return out, classify(err, what+" peer "+id)
}

// byHand runs fn on a pooled connection in a transaction that costs no
// round trip of its own (pgx's own transactions spend one on BEGIN and one
// on COMMIT): fn's first batch begins it (handTx.begin) and its last
// commits it (handTx.commit). What fn leaves open when it fails is rolled
// back, even once ctx is done, so that the pool keeps the connection: it
// closes one released inside a transaction, and a burst of timed-out
// requests would otherwise be a burst of reconnections.
func (s *Store) byHand(ctx context.Context, fn func(handTx) error) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	err = fn(handTx{conn})
	if err == nil && conn.PgConn().TxStatus() != 'I' {
		err = errors.New("pgstore: a transaction was left open")
	}
	if err != nil && !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_, _ = conn.Exec(rctx, "ROLLBACK")
		cancel()
	}
	return err
}

// handTx is byHand's connection, in the transaction or about to begin it.
type handTx struct{ conn *pgx.Conn }

// begin begins the transaction with reads's queries in the same round
// trip and hands their results to read; reads must be a newReads batch.
// The batch is closed once, and the first error is returned.
func (t handTx) begin(ctx context.Context, reads *pgx.Batch, read func(pgx.BatchResults) error) error {
	br := t.conn.SendBatch(ctx, reads)
	_, err := br.Exec() // BEGIN
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// newReads is a batch for handTx.begin: BEGIN, then what the caller
// queues.
func newReads() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	return b
}

// commit sends writes and COMMIT in one round trip.
func (t handTx) commit(ctx context.Context, writes *pgx.Batch) error {
	writes.Queue("COMMIT")
	return t.conn.SendBatch(ctx, writes).Close()
}

// rollbackTimeout bounds byHand's rollback; past it the pool closes the
// connection, which rolls back as well.
const rollbackTimeout = 2 * time.Second

func (s *Store) lockedUpdate(ctx context.Context, t handTx, id string, f func(registry.Peer, time.Time) (registry.Peer, []registry.Event)) (registry.Peer, error) {
	reads := newReads()
	queuePeer(reads, id, "FOR UPDATE")
	var prev registry.Peer
	if err := t.begin(ctx, reads, func(br pgx.BatchResults) (err error) {
		prev, err = batchPeer(br)
		return err
	}); err != nil {
		return registry.Peer{}, err
	}
	now := s.now()
	next, events := f(prev, now)
	write := &pgx.Batch{}
	if err := queuePeerWrite(write, &next, events, now); err != nil {
		return registry.Peer{}, err
	}
	s.queueChange(write, &prev, &next)
	if err := t.commit(ctx, write); err != nil {
		return registry.Peer{}, err
	}
	return next, nil
}

// queuePeer queues the reads of peer id's row (with lock, e.g. "FOR
// UPDATE", or "") and of its ranks; batchPeer reads their results.
func queuePeer(b *pgx.Batch, id, lock string) {
	b.Queue(selectPeers+"WHERE id = $1 "+lock, id)
	b.Queue(selectRanks, []string{id})
}

// batchPeer is the peer that queuePeer's reads found, pgx.ErrNoRows when
// there is none.
func batchPeer(br pgx.BatchResults) (registry.Peer, error) {
	prs, err := collectBatchRows(br, scanPeerRow)
	var rrs []rankRow
	if err == nil {
		rrs, err = collectBatchRows(br, scanRankRow)
	}
	ps, err := assemblePeers(prs, rrs, err)
	if err != nil {
		return registry.Peer{}, err
	}
	if len(ps) == 0 {
		return registry.Peer{}, pgx.ErrNoRows
	}
	return ps[0], nil
}

// queuePeerWrite queues the upsert of p's row (not its ranks) and its
// events.
func queuePeerWrite(b *pgx.Batch, p *registry.Peer, events []registry.Event, now time.Time) error {
	row, err := newPeerRow(p)
	if err != nil {
		return err
	}
	b.Queue(upsertPeer, peerColumns.fields(&row)...)
	queueEvents(b, p, events, now)
	return nil
}

// collectBatchRows scans every row of a batch's next query with scan.
func collectBatchRows[T any](br pgx.BatchResults, scan pgx.RowToFunc[T]) ([]T, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// ReportTransferFailure implements registry.Store: the decode's row is
// locked, so concurrent reports from several replicas and reporters are
// applied one after the other and collapse into one outcome. The reads go
// in one round trip with BEGIN, and the writes in one with COMMIT (byHand);
// counting the other prefills (otherPrefills) reads a page at a time.
func (s *Store) ReportTransferFailure(ctx context.Context, f registry.TransferFailure) (registry.Peer, registry.TransferOutcome, error) {
	if err := f.Validate(); err != nil {
		return registry.Peer{}, "", err
	}
	if err := checkID(f.DecodeID, "report transfer failure to peer"); err != nil {
		return registry.Peer{}, "", err
	}
	var res registry.Peer
	var out registry.TransferOutcome
	err := s.byHand(ctx, func(t handTx) (err error) {
		res, out, err = s.reportTransferFailure(ctx, t, f)
		return err
	})
	if err != nil {
		return registry.Peer{}, "", classify(err, "report transfer failure to peer "+f.DecodeID)
	}
	return res, out, nil
}

// transferFailureReads is what a transfer failure's report reads under
// the decode's lock.
type transferFailureReads struct {
	decode, prefill registry.Peer
	last            *registry.PairFailure // the pair's last failure
	quarantine      *registry.Quarantine  // the pair's quarantine, row locked
}

// readTransferFailure begins the transaction and reads, in one round trip,
// the decode (row locked) and, when the report names the prefill, the
// prefill, the pair's last failure and its quarantine (row locked), in
// that order, as the locks must be taken. All are read even when the
// decode or the prefill is not there (the quarantine's row is then locked
// until the rollback, a moment later).
func readTransferFailure(ctx context.Context, t handTx, f registry.TransferFailure) (transferFailureReads, error) {
	var r transferFailureReads
	reads := newReads()
	queuePeer(reads, f.DecodeID, "FOR UPDATE")
	if f.PrefillID != "" {
		queuePeer(reads, f.PrefillID, "")
		reads.Queue(`SELECT decode_generation, at FROM pair_failures WHERE prefill_id = $1 AND decode_id = $2`, f.PrefillID, f.DecodeID)
		reads.Queue(lockQuarantineSQL, f.PrefillID, f.DecodeID)
	}
	err := t.begin(ctx, reads, func(br pgx.BatchResults) (err error) {
		if r.decode, err = batchPeer(br); err != nil || f.PrefillID == "" {
			return err
		}
		if r.prefill, err = batchPeer(br); err != nil {
			return err
		}
		var lf registry.PairFailure
		switch err := br.QueryRow().Scan(&lf.DecodeGeneration, &lf.At); {
		case err == nil:
			lf.PrefillID, lf.DecodeID = f.PrefillID, f.DecodeID
			r.last = &lf
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		r.quarantine, err = oneQuarantine(rows)
		return err
	})
	return r, err
}

func (s *Store) reportTransferFailure(ctx context.Context, t handTx, f registry.TransferFailure) (registry.Peer, registry.TransferOutcome, error) {
	r, err := readTransferFailure(ctx, t, f)
	if err != nil {
		return registry.Peer{}, "", err
	}
	d := r.decode
	now := s.now()
	var pf *registry.Peer
	if f.PrefillID != "" {
		pf = &r.prefill
	}
	others, err := otherPrefills(ctx, t.conn, &d, f.PrefillID, s.cfg.otherPrefillsPage)
	if err != nil {
		return registry.Peer{}, "", err
	}
	next, events, q, rec, out := registry.ApplyPairTransferFailure(d, pf, f, r.last, r.quarantine, now, registry.DefaultQuarantineWindow, s.cfg.QuarantineTTL, s.cfg.Heal, others)
	res := d
	w := &pgx.Batch{}
	if q != nil {
		w.Queue(`INSERT INTO pair_quarantines (prefill_id, decode_id, detail, at, expires_at, trial) VALUES ($1, $2, $3, $4, $5, false)
			ON CONFLICT (prefill_id, decode_id) DO UPDATE SET detail = EXCLUDED.detail, at = EXCLUDED.at, expires_at = EXCLUDED.expires_at, trial = false`,
			q.PrefillID, q.DecodeID, q.Detail, now, q.ExpiresAt)
		w.Queue(insertEvent, eventArgs(&d, registry.Event{Kind: registry.EventQuarantined, Message: q.Detail, Error: f.Error}, now)...)
	}
	if rec != nil {
		w.Queue(`INSERT INTO pair_failures (prefill_id, decode_id, decode_generation, at) VALUES ($1, $2, $3, $4)
			ON CONFLICT (prefill_id, decode_id) DO UPDATE SET decode_generation = EXCLUDED.decode_generation, at = EXCLUDED.at`,
			rec.PrefillID, rec.DecodeID, rec.DecodeGeneration, rec.At)
	}
	if registry.TransferFailureChanged(events, q) {
		if len(events) > 0 || out == registry.OutcomeHealPending {
			if err := queuePeerWrite(w, &next, events, now); err != nil {
				return registry.Peer{}, "", err
			}
			res = next
		}
		if out == registry.OutcomeStale || out == registry.OutcomeQuarantined || out == registry.OutcomeHealPending {
			s.queueChange(w, &d, &next)
		}
	}
	if err := t.commit(ctx, w); err != nil {
		return registry.Peer{}, "", err
	}
	return res, out, nil
}

// Drain implements registry.Store.
func (s *Store) Drain(ctx context.Context, id string) (registry.Peer, error) {
	return s.update(ctx, id, "drain", registry.ApplyDrain)
}

// MarkStale implements registry.Store.
func (s *Store) MarkStale(ctx context.Context, id, reason, errText string) (registry.Peer, error) {
	if err := registry.ValidateStaleMark(reason, errText); err != nil {
		return registry.Peer{}, err
	}
	return s.update(ctx, id, "mark stale", func(p registry.Peer, now time.Time) (registry.Peer, []registry.Event) {
		return registry.ApplyStale(p, reason, errText, now, s.cfg.Heal)
	})
}

// Delete implements registry.Store.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := checkID(id, "delete peer"); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var p registry.Peer
		err := tx.QueryRow(ctx, "DELETE FROM peers WHERE id = $1 RETURNING id::text, name, generation", id).
			Scan(&p.ID, &p.Name, &p.Generation)
		if err != nil {
			return err
		}
		if err := s.appendEvents(ctx, tx, &p, []registry.Event{{Kind: registry.EventRemoved, Message: "removed by operator"}}, s.now()); err != nil {
			return err
		}
		return s.notify(ctx, tx, id)
	})
	return classify(err, "delete peer "+id)
}

// Get implements registry.Store.
func (s *Store) Get(ctx context.Context, id string) (registry.Peer, error) {
	if err := checkID(id, "get peer"); err != nil {
		return registry.Peer{}, err
	}
	peers, err := loadPeers(ctx, s.pool, "WHERE id = $1", id)
	if err == nil && len(peers) == 0 {
		err = pgx.ErrNoRows
	}
	if err != nil {
		return registry.Peer{}, classify(err, "get peer "+id)
	}
	return peers[0], nil
}

// Refresh implements registry.Refresher: the peers with ids (those that
// exist), every quarantine and every preflight, read by four queries sent
// together: one round trip and one implicit transaction (pgx's SendBatch
// ends the batch with a single Sync, see its doc comment). Under READ
// COMMITTED each statement still reads its own snapshot; a change that
// lands between them is read again after its own notification.
func (s *Store) Refresh(ctx context.Context, ids []string) ([]registry.Peer, []registry.Quarantine, []registry.Preflight, error) {
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if registry.IsPeerID(id) {
			valid = append(valid, id)
		}
	}
	b := &pgx.Batch{}
	b.Queue(selectPeers+"WHERE id = ANY($1::text[]::uuid[])", valid)
	b.Queue(selectRanks, valid)
	b.Queue(selectQuarantines)
	b.Queue(selectPreflights)
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	var qs []registry.Quarantine
	var pfs []registry.Preflight
	prs, err := collectBatchRows(br, scanPeerRow)
	var rrs []rankRow
	if err == nil {
		rrs, err = collectBatchRows(br, scanRankRow)
	}
	if err == nil {
		qs, err = collectBatchRows(br, scanQuarantine)
	}
	if err == nil {
		pfs, err = collectBatchRows(br, scanPreflight)
	}
	if err == nil {
		err = br.Close()
	}
	peers, err := assemblePeers(prs, rrs, err)
	if err != nil {
		return nil, nil, nil, classify(err, "refresh peers")
	}
	return peers, qs, pfs, nil
}

// List implements registry.Store; peers come sorted by name.
func (s *Store) List(ctx context.Context, f registry.Filter) ([]registry.Peer, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	where, args := "WHERE true", []any{}
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	switch f.Role {
	case "":
	case registry.RolePrefill, registry.RoleDecode:
		where += " AND role IN (" + arg(string(f.Role)) + ", 'both')"
	default:
		where += " AND role = " + arg(string(f.Role))
	}
	if f.State != "" {
		where += " AND state = " + arg(string(f.State))
	}
	if f.Model != "" {
		where += " AND model = " + arg(f.Model)
	}
	peers, err := loadPeers(ctx, s.pool, where+" ORDER BY name", args...)
	return peers, classify(err, "list peers")
}

// Quarantines implements registry.Store.
func (s *Store) Quarantines(ctx context.Context) ([]registry.Quarantine, error) {
	qs, err := collectRows(ctx, s.pool, scanQuarantine, selectQuarantines)
	return qs, classify(err, "list quarantines")
}

// holdsLeaseStates is registry.HoldsLease as an SQL list for a WHERE
// clause (`state IN ` + holdsLeaseStates): the states, fixed identifiers
// and never input, quoted as literals.
var holdsLeaseStates = func() string {
	var quoted []string
	for _, st := range registry.States() {
		if registry.HoldsLease(st) {
			quoted = append(quoted, "'"+string(st)+"'")
		}
	}
	return "(" + strings.Join(quoted, ", ") + ")"
}()

// ExpireLeases implements registry.Store. Only the replica holding the
// sweeper's advisory lock sweeps; the others return 0 at once.
func (s *Store) ExpireLeases(ctx context.Context, now time.Time) (int, error) {
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var got bool
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.lockKey).Scan(&got); err != nil || !got {
			return err
		}
		// No index serves the query
		// (migration heartbeat_hot_updates: heartbeats stay heap-only updates); it reads the
		// table once a sweep.
		// A row another transaction holds is skipped, not waited for: a
		// heartbeat may be waiting for it (heartbeatBatcher.waitLocked),
		// and the sweep must neither stall on it nor expire that peer
		// before its heartbeat lands. The next sweep looks again.
		rows, err := tx.Query(ctx, `UPDATE peers p SET state = 'failed', state_reason = $2, updated_at = $1
			FROM (SELECT id FROM peers WHERE lease_expiry < $1 AND state IN `+holdsLeaseStates+` FOR UPDATE SKIP LOCKED) x
			WHERE p.id = x.id
			RETURNING p.id::text, p.name, p.generation`, now.UTC(), registry.ReasonLeaseExpired)
		if err != nil {
			return err
		}
		expired, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (registry.Peer, error) {
			var p registry.Peer
			err := r.Scan(&p.ID, &p.Name, &p.Generation)
			return p, err
		})
		if err != nil {
			return err
		}
		ids := make([]string, len(expired))
		for i := range expired {
			ids[i] = expired[i].ID
			if err := s.appendEvents(ctx, tx, &expired[i], []registry.Event{{Kind: registry.EventExpired, Message: registry.ReasonLeaseExpired}}, now.UTC()); err != nil {
				return err
			}
		}
		movedHeals, drained, err := s.expireHeals(ctx, tx, now.UTC())
		if err != nil {
			return err
		}
		ids = append(ids, movedHeals...)
		n = len(ids)
		if n == 0 {
			return nil
		}
		if err := s.hintStale(ctx, tx, drained); err != nil {
			return err
		}
		return s.notify(ctx, tx, ids...)
	})
	return n, classify(err, "expire leases")
}

// GrantLeaseGrace implements registry.Store in one statement. It takes no
// advisory lock: lease_expiry only grows, and a sweep running at the same
// time re-checks each row it would expire after this statement commits.
func (s *Store) GrantLeaseGrace(ctx context.Context, now time.Time) (int, error) {
	var ids []string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE peers SET lease_expiry = $1
			WHERE lease_expiry < $1 AND state IN ('pending', 'ready', 'stale')
			RETURNING id::text`, now.UTC().Add(s.cfg.LeaseTTL))
		if err != nil {
			return err
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(ids) == 0 {
			return err
		}
		return s.notify(ctx, tx, ids...)
	})
	if err != nil {
		return 0, classify(err, "grant lease grace")
	}
	return len(ids), nil
}

// Events implements registry.Store.
func (s *Store) Events(ctx context.Context, q registry.EventQuery) ([]registry.Event, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	// The cursors are bigint like the ids: left to inference, "$2 = 0"
	// would make $2 an int4 and a cursor past 2^31 an error.
	sql := "SELECT id, peer_id::text, peer_name, kind, generation, message, error, at FROM peer_events WHERE ($1 = '' OR peer_id::text = $1)"
	var args []any
	if q.After > 0 {
		sql += " AND id > $2::bigint ORDER BY id LIMIT $3"
		args = []any{q.PeerID, q.After, limit}
	} else {
		sql += " AND ($2::bigint = 0 OR id < $2::bigint) ORDER BY id DESC LIMIT $3"
		args = []any{q.PeerID, q.Before, limit}
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, classify(err, "list events")
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (registry.Event, error) {
		var e registry.Event
		err := r.Scan(&e.ID, &e.PeerID, &e.PeerName, &e.Kind, &e.Generation, &e.Message, &e.Error, &e.At)
		e.At = e.At.UTC()
		return e, err
	})
	if evs == nil {
		evs = []registry.Event{}
	}
	return evs, classify(err, "list events")
}

// checkID answers ErrNotFound for a string that cannot be a peer ID, as the
// embedded store does, instead of sending it to PostgreSQL, whose uuid type
// reads other spellings of a UUID and fails on text that is not one.
func checkID(id, what string) error {
	if !registry.IsPeerID(id) {
		return fmt.Errorf("%s %q: %w", what, id, registry.ErrNotFound)
	}
	return nil
}
