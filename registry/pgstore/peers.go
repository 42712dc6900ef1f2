package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry"
)

// peerRow is a row of peers, scanned by column name.
type peerRow struct {
	ID            string     `db:"id"`
	Name          string     `db:"name"`
	Role          string     `db:"role"`
	Engine        string     `db:"engine"`
	URL           string     `db:"url"`
	BootstrapHost string     `db:"bootstrap_host"`
	BootstrapPort int        `db:"bootstrap_port"`
	Model         string     `db:"model"`
	InstanceID    string     `db:"instance_id"`
	TransferGroup string     `db:"transfer_group"`
	Labels        []byte     `db:"labels"`
	TPSize        int        `db:"tp_size"`
	AttnTPSize    int        `db:"attn_tp_size"`
	DPSize        int        `db:"dp_size"`
	PPSize        int        `db:"pp_size"`
	PPRank        int        `db:"pp_rank"`
	DCPSize       int        `db:"dcp_size"`
	DCPRank       int        `db:"dcp_rank"`
	PageSize      int        `db:"page_size"`
	KVDType       string     `db:"kv_dtype"`
	NumLayers     int        `db:"num_layers"`
	NumKVHeads    int        `db:"num_kv_heads"`
	HeadDim       int        `db:"head_dim"`
	IsMLA         bool       `db:"is_mla"`
	State         string     `db:"state"`
	StateReason   string     `db:"state_reason"`
	Generation    int64      `db:"generation"`
	LeaseExpiry   time.Time  `db:"lease_expiry"`
	LastHeartbeat *time.Time `db:"last_heartbeat"`
	LoadRunning   int        `db:"load_running"`
	LoadQueued    int        `db:"load_queued"`
	LoadKVUsage   float64    `db:"load_kv_usage"`
	CreatedAt     time.Time  `db:"created_at"`
	UpdatedAt     time.Time  `db:"updated_at"`
	CredHash      []byte     `db:"credential_hash"`
	Observed      []string   `db:"observed"`
	Unknown       []string   `db:"unknown"`
}

const peerColumns = `id::text, name, role, engine, url, bootstrap_host, bootstrap_port, model, instance_id,
	transfer_group, labels, tp_size, attn_tp_size, dp_size, pp_size, pp_rank, dcp_size, dcp_rank,
	page_size, kv_dtype, num_layers, num_kv_heads, head_dim, is_mla, state, state_reason, generation,
	lease_expiry, last_heartbeat, load_running, load_queued, load_kv_usage, created_at, updated_at, credential_hash,
	observed, unknown`

// rankRow is a row of peer_ranks.
type rankRow struct {
	PeerID        string  `db:"peer_id"`
	Rank          int     `db:"rank"`
	GPUID         int     `db:"gpu_id"`
	AgentName     string  `db:"agent_name"`
	AgentMetadata []byte  `db:"agent_metadata"`
	KVDataPtrs    []int64 `db:"kv_data_ptrs"`
	KVDataLens    []int64 `db:"kv_data_lens"`
	KVItemLens    []int64 `db:"kv_item_lens"`
	KVMemKinds    []int16 `db:"kv_mem_kinds"`
	AuxDataPtrs   []int64 `db:"aux_data_ptrs"`
	AuxDataLens   []int64 `db:"aux_data_lens"`
	TransferSec   []byte  `db:"transfer_secret"`
}

const rankColumns = `peer_id::text, rank, gpu_id, agent_name, agent_metadata, kv_data_ptrs, kv_data_lens,
	kv_item_lens, kv_mem_kinds, aux_data_ptrs, aux_data_lens, transfer_secret`

func (r *peerRow) peer() (registry.Peer, error) {
	p := registry.Peer{
		PeerSpec: registry.PeerSpec{
			Name: r.Name, Role: registry.Role(r.Role), Engine: registry.Engine(r.Engine), URL: r.URL,
			BootstrapHost: r.BootstrapHost, BootstrapPort: r.BootstrapPort, Model: r.Model,
			InstanceID: r.InstanceID, TransferGroup: r.TransferGroup,
			Parallelism: registry.Parallelism{TPSize: r.TPSize, AttnTPSize: r.AttnTPSize, DPSize: r.DPSize,
				PPSize: r.PPSize, PPRank: r.PPRank, DCPSize: r.DCPSize, DCPRank: r.DCPRank},
			KV: registry.KVGeometry{PageSize: r.PageSize, DType: r.KVDType, NumLayers: r.NumLayers,
				NumKVHeads: r.NumKVHeads, HeadDim: r.HeadDim, IsMLA: r.IsMLA},
		},
		ID: r.ID, State: registry.State(r.State), StateReason: r.StateReason, Generation: r.Generation,
		LeaseExpiry: r.LeaseExpiry.UTC(), LastHeartbeat: utcPtr(r.LastHeartbeat),
		Load:      registry.Load{Running: r.LoadRunning, Queued: r.LoadQueued, KVUsage: r.LoadKVUsage},
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
		CredentialHash: nilIfEmptyBytes(r.CredHash),
	}
	// Empty lists are nil, as the embedded store returns them.
	if len(r.Observed) > 0 {
		p.Observed = r.Observed
	}
	if len(r.Unknown) > 0 {
		p.Unknown = r.Unknown
	}
	if len(r.Labels) > 0 && string(r.Labels) != "{}" {
		if err := json.Unmarshal(r.Labels, &p.Labels); err != nil {
			return p, fmt.Errorf("decode labels of peer %s: %w", r.ID, err)
		}
	}
	return p, nil
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
		TransferSecret: nilIfEmptyBytes(r.TransferSec),
	}
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

func nilIfEmpty(v []uint64) []uint64 {
	if len(v) == 0 {
		return nil
	}
	return v
}

func nilIfEmptyBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// queryer is what both a pool and a transaction offer.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// loadPeers reads the peers that where (with args) selects, and their ranks.
func loadPeers(ctx context.Context, q queryer, where string, args ...any) ([]registry.Peer, error) {
	query := q.Query
	rows, err := query(ctx, "SELECT "+peerColumns+" FROM peers "+where, args...)
	if err != nil {
		return nil, err
	}
	prs, err := pgx.CollectRows(rows, pgx.RowToStructByName[peerRow])
	if err != nil {
		return nil, err
	}
	peers := make([]registry.Peer, len(prs))
	index := make(map[string]int, len(prs))
	ids := make([]string, len(prs))
	for i := range prs {
		if peers[i], err = prs[i].peer(); err != nil {
			return nil, err
		}
		index[prs[i].ID] = i
		ids[i] = prs[i].ID
	}
	if len(ids) == 0 {
		return peers, nil
	}
	rows, err = query(ctx, "SELECT "+rankColumns+" FROM peer_ranks WHERE peer_id = ANY($1::uuid[]) ORDER BY peer_id, rank", ids)
	if err != nil {
		return nil, err
	}
	rrs, err := pgx.CollectRows(rows, pgx.RowToStructByName[rankRow])
	if err != nil {
		return nil, err
	}
	for i := range rrs {
		p := &peers[index[rrs[i].PeerID]]
		p.Ranks = append(p.Ranks, rrs[i].rank())
	}
	return peers, nil
}
