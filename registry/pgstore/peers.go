package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// column is one column of a table read into and written from a Go row R.
// The list of a table's columns is the one place that names them: every
// SELECT list, INSERT list, upsert SET list, scan and argument order is
// built from it.
type column[R any] struct {
	name string
	// sel is the expression a SELECT reads the column with; the bare name
	// when empty.
	sel string
	// keep marks a column an upsert leaves as the first write set it.
	keep bool
	// at is where the column lives in a row: the scan destination, and
	// (pgx dereferences it) the argument of a write.
	at func(*R) any
}

type columns[R any] []column[R]

// names is the columns' names in order, as an INSERT or COPY lists them.
func (cs columns[R]) names() []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name
	}
	return out
}

// selectList is the columns as a SELECT reads them.
func (cs columns[R]) selectList() string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name
		if c.sel != "" {
			out[i] = c.sel
		}
	}
	return strings.Join(out, ", ")
}

// fields is where each column lives in r, in column order: the scan
// destinations of a SELECT and the arguments of an INSERT.
func (cs columns[R]) fields(r *R) []any {
	out := make([]any, len(cs))
	for i, c := range cs {
		out[i] = c.at(r)
	}
	return out
}

// upsert is an INSERT of every column that, on a conflict over key,
// overwrites every column but key and those marked keep.
func (cs columns[R]) upsert(table, key string) string {
	params := make([]string, len(cs))
	var set []string
	for i, c := range cs {
		params[i] = "$" + strconv.Itoa(i+1)
		if c.name != key && !c.keep {
			set = append(set, c.name+" = EXCLUDED."+c.name)
		}
	}
	return "INSERT INTO " + table + " (" + strings.Join(cs.names(), ", ") + ")\nVALUES (" + strings.Join(params, ", ") +
		")\nON CONFLICT (" + key + ") DO UPDATE SET\n\t" + strings.Join(set, ",\n\t")
}

// scanner scans a row of the columns into a fresh R.
func (cs columns[R]) scanner() pgx.RowToFunc[R] {
	return func(row pgx.CollectableRow) (R, error) {
		var r R
		err := row.Scan(cs.fields(&r)...)
		return r, err
	}
}

// peerRow is a row of peers: the peer, with its labels in their stored
// (JSON) form. Reads normalise it with peer, writes fill it with newPeerRow.
type peerRow struct {
	registry.Peer
	labels []byte
	heal   []byte
}

func col[R any](name string, at func(*R) any) column[R] { return column[R]{name: name, at: at} }

// peerColumns are the columns of peers. A new column is one line here (and
// one in a migration).
var peerColumns = columns[peerRow]{
	{name: "id", sel: "id::text", at: func(r *peerRow) any { return &r.ID }},
	col("name", func(r *peerRow) any { return &r.Name }),
	col("role", func(r *peerRow) any { return &r.Role }),
	col("engine", func(r *peerRow) any { return &r.Engine }),
	col("url", func(r *peerRow) any { return &r.URL }),
	col("bootstrap_host", func(r *peerRow) any { return &r.BootstrapHost }),
	col("bootstrap_port", func(r *peerRow) any { return &r.BootstrapPort }),
	col("model", func(r *peerRow) any { return &r.Model }),
	col("instance_id", func(r *peerRow) any { return &r.InstanceID }),
	col("transfer_group", func(r *peerRow) any { return &r.TransferGroup }),
	col("labels", func(r *peerRow) any { return &r.labels }),
	col("kv_events_endpoint", func(r *peerRow) any { return &r.KVEvents.Endpoint }),
	col("kv_events_replay_endpoint", func(r *peerRow) any { return &r.KVEvents.ReplayEndpoint }),
	col("kv_events_topic", func(r *peerRow) any { return &r.KVEvents.Topic }),
	col("tp_size", func(r *peerRow) any { return &r.Parallelism.TPSize }),
	col("attn_tp_size", func(r *peerRow) any { return &r.Parallelism.AttnTPSize }),
	col("dp_size", func(r *peerRow) any { return &r.Parallelism.DPSize }),
	col("pp_size", func(r *peerRow) any { return &r.Parallelism.PPSize }),
	col("pp_rank", func(r *peerRow) any { return &r.Parallelism.PPRank }),
	col("dcp_size", func(r *peerRow) any { return &r.Parallelism.DCPSize }),
	col("dcp_rank", func(r *peerRow) any { return &r.Parallelism.DCPRank }),
	col("page_size", func(r *peerRow) any { return &r.KV.PageSize }),
	col("kv_dtype", func(r *peerRow) any { return &r.KV.DType }),
	col("num_layers", func(r *peerRow) any { return &r.KV.NumLayers }),
	col("num_kv_heads", func(r *peerRow) any { return &r.KV.NumKVHeads }),
	col("head_dim", func(r *peerRow) any { return &r.KV.HeadDim }),
	col("is_mla", func(r *peerRow) any { return &r.KV.IsMLA }),
	col("state", func(r *peerRow) any { return &r.State }),
	col("state_reason", func(r *peerRow) any { return &r.StateReason }),
	col("generation", func(r *peerRow) any { return &r.Generation }),
	col("lease_expiry", func(r *peerRow) any { return &r.LeaseExpiry }),
	col("last_heartbeat", func(r *peerRow) any { return &r.LastHeartbeat }),
	col("load_running", func(r *peerRow) any { return &r.Load.Running }),
	col("load_queued", func(r *peerRow) any { return &r.Load.Queued }),
	col("load_kv_usage", func(r *peerRow) any { return &r.Load.KVUsage }),
	{name: "created_at", keep: true, at: func(r *peerRow) any { return &r.CreatedAt }},
	col("updated_at", func(r *peerRow) any { return &r.UpdatedAt }),
	col("credential_hash", func(r *peerRow) any { return &r.CredentialHash }),
	col("observed", func(r *peerRow) any { return &r.Observed }),
	col("unknown", func(r *peerRow) any { return &r.Unknown }),
	col("heal", func(r *peerRow) any { return &r.heal }),
}

// rankRow is a row of peer_ranks: a rank in its stored form, whose
// uint64s are bigints bit for bit and whose memory kinds are smallints.
type rankRow struct {
	PeerID        string
	Rank          int
	GPUID         int
	AgentName     string
	AgentMetadata []byte
	KVDataPtrs    []int64
	KVDataLens    []int64
	KVItemLens    []int64
	KVMemKinds    []int16
	AuxDataPtrs   []int64
	AuxDataLens   []int64
	TransferSec   []byte
}

// rankColumns are the columns of peer_ranks.
var rankColumns = columns[rankRow]{
	{name: "peer_id", sel: "peer_id::text", at: func(r *rankRow) any { return &r.PeerID }},
	col("rank", func(r *rankRow) any { return &r.Rank }),
	col("gpu_id", func(r *rankRow) any { return &r.GPUID }),
	col("agent_name", func(r *rankRow) any { return &r.AgentName }),
	col("agent_metadata", func(r *rankRow) any { return &r.AgentMetadata }),
	col("kv_data_ptrs", func(r *rankRow) any { return &r.KVDataPtrs }),
	col("kv_data_lens", func(r *rankRow) any { return &r.KVDataLens }),
	col("kv_item_lens", func(r *rankRow) any { return &r.KVItemLens }),
	col("kv_mem_kinds", func(r *rankRow) any { return &r.KVMemKinds }),
	col("aux_data_ptrs", func(r *rankRow) any { return &r.AuxDataPtrs }),
	col("aux_data_lens", func(r *rankRow) any { return &r.AuxDataLens }),
	col("transfer_secret", func(r *rankRow) any { return &r.TransferSec }),
}

// The statements built from the column lists, once, so that each call
// sends the same text and pgx's statement cache prepares it once.
var (
	selectPeers = "SELECT " + peerColumns.selectList() + " FROM peers "
	upsertPeer  = peerColumns.upsert("peers", "id")
	selectRanks = "SELECT " + rankColumns.selectList() + " FROM peer_ranks WHERE peer_id = ANY($1::text[]::uuid[]) ORDER BY peer_id, rank"
	rankNames   = rankColumns.names()
	scanPeerRow = peerColumns.scanner()
	scanRankRow = rankColumns.scanner()
)

// peer is the row as the domain has it: times in UTC, and empty lists and
// byte strings nil, as the embedded store returns them.
func (r *peerRow) peer() (registry.Peer, error) {
	p := r.Peer
	p.LeaseExpiry, p.CreatedAt, p.UpdatedAt = p.LeaseExpiry.UTC(), p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	p.LastHeartbeat = utcPtr(p.LastHeartbeat)
	p.CredentialHash = nilIfEmpty(p.CredentialHash)
	p.Observed, p.Unknown = nilIfEmpty(p.Observed), nilIfEmpty(p.Unknown)
	p.Labels = nil
	if len(r.labels) > 0 && string(r.labels) != "{}" {
		if err := json.Unmarshal(r.labels, &p.Labels); err != nil {
			return p, fmt.Errorf("decode labels of peer %s: %w", p.ID, err)
		}
	}
	var err error
	if p.Heal, err = decodeHeal(r.heal); err != nil {
		return p, fmt.Errorf("decode heal plan of peer %s: %w", p.ID, err)
	}
	return p, nil
}

// newPeerRow is p in its stored form: labels as JSON, and absent byte
// strings and lists empty (the columns are NOT NULL).
func newPeerRow(p *registry.Peer) (peerRow, error) {
	r := peerRow{Peer: *p, labels: []byte("{}")}
	if p.Labels != nil {
		var err error
		if r.labels, err = json.Marshal(p.Labels); err != nil {
			return r, fmt.Errorf("encode labels: %w", err)
		}
	}
	r.CredentialHash, r.Observed, r.Unknown = nonNil(p.CredentialHash), nonNil(p.Observed), nonNil(p.Unknown)
	r.heal = encodeHeal(p.Heal)
	return r, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (r *rankRow) rank() registry.Rank {
	kinds := make([]registry.MemKind, len(r.KVMemKinds))
	for i, k := range r.KVMemKinds {
		kinds[i] = registry.MemKind(k)
	}
	return registry.Rank{
		Rank: r.Rank, GPUID: r.GPUID, AgentName: r.AgentName, AgentMetadata: r.AgentMetadata,
		KVDataPtrs: toU64(r.KVDataPtrs), KVDataLens: toU64(r.KVDataLens), KVItemLens: toU64(r.KVItemLens),
		KVMemKinds: kinds, AuxDataPtrs: nilIfEmpty(toU64(r.AuxDataPtrs)), AuxDataLens: nilIfEmpty(toU64(r.AuxDataLens)),
		TransferSecret: nilIfEmpty(r.TransferSec),
	}
}

// newRankRow is the rank r of peer id in its stored form.
func newRankRow(id string, r *registry.Rank) rankRow {
	kinds := make([]int16, len(r.KVMemKinds))
	for j, k := range r.KVMemKinds {
		kinds[j] = int16(k)
	}
	return rankRow{PeerID: id, Rank: r.Rank, GPUID: r.GPUID, AgentName: r.AgentName, AgentMetadata: nonNil(r.AgentMetadata),
		KVDataPtrs: toI64(r.KVDataPtrs), KVDataLens: toI64(r.KVDataLens), KVItemLens: toI64(r.KVItemLens),
		KVMemKinds: kinds, AuxDataPtrs: toI64(r.AuxDataPtrs), AuxDataLens: toI64(r.AuxDataLens),
		TransferSec: nonNil(r.TransferSecret)}
}

// uint64 values are stored bit-for-bit in bigint: addresses above 2^63 come
// back unchanged.
func toU64(v []int64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = uint64(x)
	}
	return out
}

func toI64(v []uint64) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// nilIfEmpty reads an empty byte string or list back as absent, as the
// embedded store has it.
func nilIfEmpty[T any](v []T) []T {
	if len(v) == 0 {
		return nil
	}
	return v
}

// nonNil stores an absent byte string or list as an empty one (the columns
// are NOT NULL).
func nonNil[T any](l []T) []T {
	if l == nil {
		return []T{}
	}
	return l
}

// queryer is what both a pool and a transaction offer.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// collectRows runs sql (with args) on q and scans every row with scan.
func collectRows[T any](ctx context.Context, q queryer, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// loadPeers reads the peers that where (with args) selects, and their ranks.
func loadPeers(ctx context.Context, q queryer, where string, args ...any) ([]registry.Peer, error) {
	prs, err := collectRows(ctx, q, scanPeerRow, selectPeers+where, args...)
	if err != nil || len(prs) == 0 {
		return assemblePeers(prs, nil, err)
	}
	ids := make([]string, len(prs))
	for i := range prs {
		ids[i] = prs[i].ID
	}
	rrs, err := collectRows(ctx, q, scanRankRow, selectRanks, ids)
	return assemblePeers(prs, rrs, err)
}

// assemblePeers makes peers of their rows and their ranks' rows (err: the
// reads' error, returned as is).
func assemblePeers(prs []peerRow, rrs []rankRow, err error) ([]registry.Peer, error) {
	if err != nil {
		return nil, err
	}
	peers := make([]registry.Peer, len(prs))
	index := make(map[string]int, len(prs))
	for i := range prs {
		if peers[i], err = prs[i].peer(); err != nil {
			return nil, err
		}
		index[prs[i].ID] = i
	}
	for i := range rrs {
		if j, ok := index[rrs[i].PeerID]; ok {
			p := &peers[j]
			p.Ranks = append(p.Ranks, rrs[i].rank())
		}
	}
	return peers, nil
}
