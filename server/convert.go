package server

import (
	"fmt"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
)

// specFromAPI converts a registration body, naming the field of any value
// that cannot be converted (an unknown memory kind, say).
func specFromAPI(b *api.PeerRegistration) (registry.PeerSpec, error) {
	s := registry.PeerSpec{
		Name: b.Name, Role: registry.Role(b.Role), Engine: registry.Engine(b.Engine), URL: b.Url,
		BootstrapHost: deref(b.BootstrapHost), BootstrapPort: deref(b.BootstrapPort),
		Model: b.Model, InstanceID: b.InstanceId, TransferGroup: deref(b.TransferGroup),
		Parallelism: registry.Parallelism{
			TPSize: b.Parallelism.TpSize, AttnTPSize: deref(b.Parallelism.AttnTpSize), DPSize: deref(b.Parallelism.DpSize),
			PPSize: deref(b.Parallelism.PpSize), PPRank: deref(b.Parallelism.PpRank),
			DCPSize: deref(b.Parallelism.DcpSize), DCPRank: deref(b.Parallelism.DcpRank),
		},
		KV: registry.KVGeometry{PageSize: b.Kv.PageSize, DType: b.Kv.Dtype, NumLayers: deref(b.Kv.NumLayers),
			NumKVHeads: deref(b.Kv.NumKvHeads), HeadDim: deref(b.Kv.HeadDim), IsMLA: deref(b.Kv.IsMla)},
	}
	if b.Labels != nil {
		s.Labels = *b.Labels
	}
	for _, f := range deref(b.Observed) {
		s.Observed = append(s.Observed, string(f))
	}
	for _, f := range deref(b.Unknown) {
		s.Unknown = append(s.Unknown, string(f))
	}
	if b.Ranks != nil && len(*b.Ranks) > 0 {
		s.Ranks = make([]registry.Rank, len(*b.Ranks))
	}
	for i, r := range deref(b.Ranks) {
		kinds := make([]registry.MemKind, len(r.KvMemKinds))
		for j, k := range r.KvMemKinds {
			v, err := registry.ParseMemKind(string(k))
			if err != nil {
				return s, &registry.FieldError{Field: fmt.Sprintf("ranks[%d].kv_mem_kinds[%d]", i, j), Detail: err.Error()}
			}
			kinds[j] = v
		}
		gpu := 0
		if r.GpuId != nil {
			gpu = *r.GpuId
		}
		s.Ranks[i] = registry.Rank{
			Rank: r.Rank, GPUID: gpu, AgentName: r.AgentName, AgentMetadata: deref(r.AgentMetadata),
			KVDataPtrs: r.KvDataPtrs, KVDataLens: r.KvDataLens, KVItemLens: r.KvItemLens, KVMemKinds: kinds,
			AuxDataPtrs: deref(r.AuxDataPtrs), AuxDataLens: deref(r.AuxDataLens),
			TransferSecret: deref(r.TransferSecret),
		}
	}
	return s.WithDefaults(), nil
}

func (s *Server) peerToAPI(p *registry.Peer) api.Peer {
	out := api.Peer{
		Id: p.ID, Name: p.Name, Role: api.Role(p.Role), Engine: api.Engine(p.Engine), Url: p.URL,
		BootstrapHost: opt(p.BootstrapHost), BootstrapPort: opt(p.BootstrapPort), Model: p.Model,
		InstanceId: p.InstanceID, TransferGroup: opt(p.TransferGroup),
		Parallelism: api.Parallelism{
			TpSize: p.Parallelism.TPSize, AttnTpSize: &p.Parallelism.AttnTPSize, DpSize: &p.Parallelism.DPSize,
			PpSize: &p.Parallelism.PPSize, PpRank: &p.Parallelism.PPRank, DcpSize: &p.Parallelism.DCPSize, DcpRank: &p.Parallelism.DCPRank,
		},
		Kv:    kvToAPI(p),
		State: api.State(p.State), StateReason: opt(p.StateReason), Generation: p.Generation,
		LeaseExpiry: p.LeaseExpiry, LastHeartbeat: p.LastHeartbeat,
		Load:      api.Load{Running: p.Load.Running, Queued: p.Load.Queued, KvUsage: p.Load.KVUsage},
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt,
		HeartbeatIntervalSeconds: s.cfg.HeartbeatInterval.Seconds(),
		LeaseTtlSeconds:          s.cfg.LeaseTTL.Seconds(),
	}
	if len(p.Labels) > 0 {
		labels := p.Labels
		out.Labels = &labels
	}
	out.Observed, out.Unknown = provenanceToAPI(p)
	if !p.Knows(registry.FieldRanks) {
		return out
	}
	ranks := make([]api.Rank, len(p.Ranks))
	out.Ranks = &ranks
	for i := range p.Ranks {
		r := &p.Ranks[i]
		kinds := make([]api.MemKind, len(r.KVMemKinds))
		for j, k := range r.KVMemKinds {
			kinds[j] = api.MemKind(k.String())
		}
		gpu := r.GPUID
		ranks[i] = api.Rank{
			Rank: r.Rank, GpuId: &gpu, AgentName: r.AgentName, KvDataPtrs: r.KVDataPtrs, KvDataLens: r.KVDataLens,
			KvItemLens: r.KVItemLens, KvMemKinds: kinds,
		}
		if len(r.AgentMetadata) > 0 {
			meta := r.AgentMetadata
			ranks[i].AgentMetadata = &meta
		}
		if len(r.AuxDataPtrs) > 0 {
			ptrs, lens := r.AuxDataPtrs, r.AuxDataLens
			ranks[i].AuxDataPtrs, ranks[i].AuxDataLens = &ptrs, &lens
		}
		if len(r.TransferSecret) > 0 {
			sec := r.TransferSecret
			ranks[i].TransferSecret = &sec
		}
	}
	return out
}

// peerSummaryToAPI is what anyone may read about a peer: identity, life,
// geometry, and per rank the sizes and kinds of its regions — never a KV
// pointer, the agent metadata or a transfer secret, which together let a
// caller reach into the peer's memory. It is also a few hundred bytes where
// the metadata runs to megabytes, so the status page can poll it.
func (s *Server) peerSummaryToAPI(p *registry.Peer) api.PeerSummary {
	out := api.PeerSummary{
		Id: p.ID, Name: p.Name, Role: api.Role(p.Role), Engine: api.Engine(p.Engine), Url: p.URL,
		BootstrapHost: opt(p.BootstrapHost), BootstrapPort: opt(p.BootstrapPort), Model: p.Model,
		InstanceId: p.InstanceID, TransferGroup: opt(p.TransferGroup),
		Parallelism: api.Parallelism{
			TpSize: p.Parallelism.TPSize, AttnTpSize: &p.Parallelism.AttnTPSize, DpSize: &p.Parallelism.DPSize,
			PpSize: &p.Parallelism.PPSize, PpRank: &p.Parallelism.PPRank, DcpSize: &p.Parallelism.DCPSize, DcpRank: &p.Parallelism.DCPRank,
		},
		Kv:    kvToAPI(p),
		State: api.State(p.State), StateReason: opt(p.StateReason), Generation: p.Generation,
		LeaseExpiry: p.LeaseExpiry, LastHeartbeat: p.LastHeartbeat,
		Load:      api.Load{Running: p.Load.Running, Queued: p.Load.Queued, KvUsage: p.Load.KVUsage},
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt,
		HeartbeatIntervalSeconds: s.cfg.HeartbeatInterval.Seconds(),
		LeaseTtlSeconds:          s.cfg.LeaseTTL.Seconds(),
	}
	if len(p.Labels) > 0 {
		labels := p.Labels
		out.Labels = &labels
	}
	out.Observed, out.Unknown = provenanceToAPI(p)
	if !p.Knows(registry.FieldRanks) {
		return out
	}
	ranks := make([]api.RankSummary, len(p.Ranks))
	out.Ranks = &ranks
	for i := range p.Ranks {
		r := &p.Ranks[i]
		kinds := make([]api.MemKind, len(r.KVMemKinds))
		for j, k := range r.KVMemKinds {
			kinds[j] = api.MemKind(k.String())
		}
		var total uint64
		for _, l := range r.KVDataLens {
			total += l
		}
		gpu := r.GPUID
		ranks[i] = api.RankSummary{
			Rank: r.Rank, GpuId: &gpu, AgentName: r.AgentName, Regions: len(r.KVDataLens), KvBytes: total,
			KvDataLens: r.KVDataLens, KvMemKinds: kinds, AuxRegions: len(r.AuxDataPtrs),
			AgentMetadataBytes: len(r.AgentMetadata),
		}
	}
	return out
}

// kvToAPI converts the KV geometry. An unknown field is absent, never a
// zero that reads as a value.
func kvToAPI(p *registry.Peer) api.KVGeometry {
	kv := api.KVGeometry{PageSize: p.KV.PageSize, Dtype: p.KV.DType}
	if p.Knows(registry.FieldNumLayers) {
		kv.NumLayers = &p.KV.NumLayers
	}
	if p.Knows(registry.FieldNumKVHeads) {
		kv.NumKvHeads = &p.KV.NumKVHeads
	}
	if p.Knows(registry.FieldHeadDim) {
		kv.HeadDim = &p.KV.HeadDim
	}
	if p.Knows(registry.FieldIsMLA) {
		kv.IsMla = &p.KV.IsMLA
	}
	return kv
}

// provenanceToAPI lists the fields read from the engine and those nobody
// could tell; nil for none.
func provenanceToAPI(p *registry.Peer) (*[]api.ProvenanceField, *[]api.UnknownField) {
	var obs *[]api.ProvenanceField
	var unk *[]api.UnknownField
	if len(p.Observed) > 0 {
		l := make([]api.ProvenanceField, len(p.Observed))
		for i, f := range p.Observed {
			l[i] = api.ProvenanceField(f)
		}
		obs = &l
	}
	if len(p.Unknown) > 0 {
		l := make([]api.UnknownField, len(p.Unknown))
		for i, f := range p.Unknown {
			l[i] = api.UnknownField(f)
		}
		unk = &l
	}
	return obs, unk
}

func eventToAPI(e *registry.Event) api.Event {
	return api.Event{Id: e.ID, PeerId: e.PeerID, PeerName: e.PeerName, Kind: api.EventKind(e.Kind),
		Generation: e.Generation, Message: opt(e.Message), Error: opt(e.Error), At: e.At}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// opt returns a pointer to v, or nil for the zero value, so empty optional
// fields are left out of JSON.
func opt[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}
