// Package apiconv is the one conversion between the control plane's wire
// types (server/api, generated from openapi.yaml) and the registry's domain
// types. The control plane reads registrations and writes peers through it;
// the agent writes its registration through it, so both ends of the wire
// spell a peer the same way.
package apiconv

import (
	"fmt"
	"slices"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server/api"
)

// Spec converts a registration body, naming the field of any value that
// cannot be converted (an unknown memory kind, say). Unset optional fields
// stay unset: the caller applies registry.PeerSpec.WithDefaults when it
// wants them filled.
func Spec(b *api.PeerRegistration) (registry.PeerSpec, error) {
	s := registry.PeerSpec{
		Name: b.Name, Role: registry.Role(b.Role), Engine: registry.Engine(b.Engine), URL: b.Url,
		BootstrapHost: Deref(b.BootstrapHost), BootstrapPort: Deref(b.BootstrapPort),
		Model: b.Model, InstanceID: b.InstanceId, TransferGroup: Deref(b.TransferGroup),
		Labels: Deref(b.Labels), KVEvents: kvEvents(b.KvEvents),
		Parallelism: registry.Parallelism{
			TPSize: b.Parallelism.TpSize, AttnTPSize: Deref(b.Parallelism.AttnTpSize), DPSize: Deref(b.Parallelism.DpSize),
			PPSize: Deref(b.Parallelism.PpSize), PPRank: Deref(b.Parallelism.PpRank),
			DCPSize: Deref(b.Parallelism.DcpSize), DCPRank: Deref(b.Parallelism.DcpRank),
		},
		KV: registry.KVGeometry{PageSize: b.Kv.PageSize, DType: b.Kv.Dtype, NumLayers: Deref(b.Kv.NumLayers),
			NumKVHeads: Deref(b.Kv.NumKvHeads), HeadDim: Deref(b.Kv.HeadDim), IsMLA: Deref(b.Kv.IsMla)},
	}
	for _, f := range Deref(b.Observed) {
		s.Observed = append(s.Observed, string(f))
	}
	for _, f := range Deref(b.Unknown) {
		s.Unknown = append(s.Unknown, string(f))
	}
	if b.Ranks != nil && len(*b.Ranks) > 0 {
		s.Ranks = make([]registry.Rank, len(*b.Ranks))
	}
	for i, r := range Deref(b.Ranks) {
		kinds := make([]registry.MemKind, len(r.KvMemKinds))
		for j, k := range r.KvMemKinds {
			v, err := registry.ParseMemKind(string(k))
			if err != nil {
				return s, &registry.FieldError{Field: fmt.Sprintf("ranks[%d].kv_mem_kinds[%d]", i, j), Detail: err.Error()}
			}
			kinds[j] = v
		}
		s.Ranks[i] = registry.Rank{
			Rank: r.Rank, GPUID: Deref(r.GpuId), AgentName: r.AgentName, AgentMetadata: Deref(r.AgentMetadata),
			KVDataPtrs: r.KvDataPtrs, KVDataLens: r.KvDataLens, KVItemLens: r.KvItemLens, KVMemKinds: kinds,
			AuxDataPtrs: Deref(r.AuxDataPtrs), AuxDataLens: Deref(r.AuxDataLens),
			TransferSecret: Deref(r.TransferSecret),
		}
	}
	return s, nil
}

// kvEvents converts a registration's KV events publisher; nil: none.
func kvEvents(k *api.KVEvents) registry.KVEvents {
	if k == nil {
		return registry.KVEvents{}
	}
	return registry.KVEvents{Endpoint: k.Endpoint, ReplayEndpoint: Deref(k.ReplayEndpoint), Topic: Deref(k.Topic)}
}

// Registration is the registration body of s: what an agent sends, and the
// spec part of every peer the control plane answers with. An unknown field
// is absent, never a zero that reads as a value; ranks are listed whenever
// they are known.
func Registration(s *registry.PeerSpec) api.PeerRegistration {
	out := api.PeerRegistration{
		Name: s.Name, Role: api.Role(s.Role), Engine: api.Engine(s.Engine), Url: s.URL,
		BootstrapHost: Opt(s.BootstrapHost), BootstrapPort: Opt(s.BootstrapPort), Model: s.Model,
		InstanceId: s.InstanceID, TransferGroup: Opt(s.TransferGroup),
		Parallelism: api.Parallelism{
			TpSize: s.Parallelism.TPSize, AttnTpSize: &s.Parallelism.AttnTPSize, DpSize: &s.Parallelism.DPSize,
			PpSize: &s.Parallelism.PPSize, PpRank: &s.Parallelism.PPRank, DcpSize: &s.Parallelism.DCPSize, DcpRank: &s.Parallelism.DCPRank,
		},
		Kv: api.KVGeometry{PageSize: s.KV.PageSize, Dtype: s.KV.DType},
	}
	if s.Knows(registry.FieldNumLayers) {
		out.Kv.NumLayers = &s.KV.NumLayers
	}
	if s.Knows(registry.FieldNumKVHeads) {
		out.Kv.NumKvHeads = &s.KV.NumKVHeads
	}
	if s.Knows(registry.FieldHeadDim) {
		out.Kv.HeadDim = &s.KV.HeadDim
	}
	if s.Knows(registry.FieldIsMLA) {
		out.Kv.IsMla = &s.KV.IsMLA
	}
	if len(s.Labels) > 0 {
		out.Labels = &s.Labels
	}
	if s.KVEvents.Endpoint != "" {
		out.KvEvents = &api.KVEvents{Endpoint: s.KVEvents.Endpoint,
			ReplayEndpoint: Opt(s.KVEvents.ReplayEndpoint), Topic: Opt(s.KVEvents.Topic)}
	}
	out.Observed = list[api.ProvenanceField](s.Observed)
	out.Unknown = list[api.UnknownField](s.Unknown)
	if s.Knows(registry.FieldRanks) {
		ranks := make([]api.Rank, len(s.Ranks))
		for i := range s.Ranks {
			ranks[i] = rank(&s.Ranks[i])
		}
		out.Ranks = &ranks
	}
	return out
}

func rank(r *registry.Rank) api.Rank {
	gpu := r.GPUID
	out := api.Rank{
		Rank: r.Rank, GpuId: &gpu, AgentName: r.AgentName, KvDataPtrs: r.KVDataPtrs, KvDataLens: r.KVDataLens,
		KvItemLens: r.KVItemLens, KvMemKinds: memKinds(r.KVMemKinds),
	}
	if len(r.AgentMetadata) > 0 {
		out.AgentMetadata = &r.AgentMetadata
	}
	if len(r.AuxDataPtrs) > 0 {
		out.AuxDataPtrs, out.AuxDataLens = &r.AuxDataPtrs, &r.AuxDataLens
	}
	if len(r.TransferSecret) > 0 {
		out.TransferSecret = &r.TransferSecret
	}
	return out
}

func memKinds(ks []registry.MemKind) []api.MemKind {
	out := make([]api.MemKind, len(ks))
	for i, k := range ks {
		out[i] = api.MemKind(k.String())
	}
	return out
}

// list converts a list of field paths; nil for none, so that it is left out.
func list[T ~string](l []string) *[]T {
	if len(l) == 0 {
		return nil
	}
	out := make([]T, len(l))
	for i, f := range l {
		out[i] = T(f)
	}
	return &out
}

// Timing is what the control plane tells every peer about its clock: how
// often to heartbeat and how long a lease lasts.
type Timing struct {
	HeartbeatInterval time.Duration
	LeaseTTL          time.Duration
}

// Peer is all the control plane holds about p that it may tell the peer
// itself or an operator: the registration, ranks included, and its life.
func Peer(p *registry.Peer, t Timing) api.Peer {
	reg := Registration(&p.PeerSpec)
	return api.Peer{
		Name: reg.Name, Role: reg.Role, Engine: reg.Engine, Url: reg.Url,
		BootstrapHost: reg.BootstrapHost, BootstrapPort: reg.BootstrapPort, Model: reg.Model,
		InstanceId: reg.InstanceId, TransferGroup: reg.TransferGroup, Labels: reg.Labels, KvEvents: reg.KvEvents,
		Parallelism: reg.Parallelism, Kv: reg.Kv, Observed: reg.Observed, Unknown: reg.Unknown, Ranks: reg.Ranks,
		Id: p.ID, State: api.State(p.State), StateReason: Opt(p.StateReason), Generation: p.Generation,
		LeaseExpiry: p.LeaseExpiry, LastHeartbeat: p.LastHeartbeat,
		Load:      Load(p.Load),
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt,
		HeartbeatIntervalSeconds: t.HeartbeatInterval.Seconds(),
		LeaseTtlSeconds:          t.LeaseTTL.Seconds(),
		Heal:                     HealPlan(&p.Heal),
	}
}

// HealPlan converts a peer's heal plan; nil when none runs.
func HealPlan(h *registry.Heal) *api.HealPlan {
	if !h.Active() {
		return nil
	}
	out := &api.HealPlan{Phase: api.HealPlanPhase(h.Phase), Reason: Opt(h.Reason), FromGeneration: h.FromGeneration,
		Started: h.Started, Deadline: h.Deadline}
	if !h.Acted.IsZero() {
		t := h.Acted
		out.Acted = &t
	}
	if len(h.Pairs) > 0 {
		pairs := slices.Clone(h.Pairs)
		out.Pairs = &pairs
	}
	return out
}

// PeerSummary is what anyone may read about a peer: identity, life,
// geometry, and per rank the sizes and kinds of its regions — never a KV
// pointer, the agent metadata or a transfer secret, which together let a
// caller reach into the peer's memory. It is also a few hundred bytes where
// the metadata runs to megabytes, so the status page can poll it.
//
// It is Peer with the ranks summarised; the fields the two share are copied
// from Peer, so each is converted in one place.
func PeerSummary(p *registry.Peer, t Timing) api.PeerSummary {
	f := Peer(p, t)
	out := api.PeerSummary{
		Name: f.Name, Role: f.Role, Engine: f.Engine, Url: f.Url,
		BootstrapHost: f.BootstrapHost, BootstrapPort: f.BootstrapPort, Model: f.Model,
		InstanceId: f.InstanceId, TransferGroup: f.TransferGroup, Labels: f.Labels, KvEvents: f.KvEvents,
		Parallelism: f.Parallelism, Kv: f.Kv, Observed: f.Observed, Unknown: f.Unknown,
		Id: f.Id, State: f.State, StateReason: f.StateReason, Generation: f.Generation,
		LeaseExpiry: f.LeaseExpiry, LastHeartbeat: f.LastHeartbeat, Load: f.Load,
		CreatedAt: f.CreatedAt, UpdatedAt: f.UpdatedAt,
		HeartbeatIntervalSeconds: f.HeartbeatIntervalSeconds, LeaseTtlSeconds: f.LeaseTtlSeconds, Heal: f.Heal,
	}
	if f.Ranks == nil {
		return out
	}
	ranks := make([]api.RankSummary, len(*f.Ranks))
	out.Ranks = &ranks
	for i, r := range *f.Ranks {
		var total uint64
		for _, l := range r.KvDataLens {
			total += l
		}
		ranks[i] = api.RankSummary{
			Rank: r.Rank, GpuId: r.GpuId, AgentName: r.AgentName, Regions: len(r.KvDataLens), KvBytes: total,
			KvDataLens: r.KvDataLens, KvMemKinds: r.KvMemKinds, AuxRegions: len(Deref(r.AuxDataPtrs)),
			AgentMetadataBytes: len(Deref(r.AgentMetadata)),
		}
	}
	return out
}

// Load converts what a peer reports about its work.
func Load(l registry.Load) api.Load {
	return api.Load{Running: l.Running, Queued: l.Queued, KvUsage: l.KVUsage}
}

// Event converts an entry of the event log.
func Event(e *registry.Event) api.Event {
	return api.Event{Id: e.ID, PeerId: e.PeerID, PeerName: e.PeerName, Kind: api.EventKind(e.Kind),
		Generation: e.Generation, Message: Opt(e.Message), Error: Opt(e.Error), At: e.At}
}

// Deref is the value p points to, or the zero value for nil: an optional
// field left out.
func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Opt returns a pointer to v, or nil for the zero value, so empty optional
// fields are left out of JSON.
func Opt[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// Breaker converts a router's circuit breaker as server.Breakers reports
// it; nil when the router tracks none.
func Breaker(state string, since time.Time, ok bool) *api.Breaker {
	if !ok {
		return nil
	}
	out := &api.Breaker{State: api.BreakerState(state)}
	if !since.IsZero() {
		out.Since = &since
	}
	return out
}

// GeometryClass converts a class of peers that pair alike.
func GeometryClass(c replica.GeometryClass) api.GeometryClass {
	return api.GeometryClass{Id: c.ID, Model: c.Model, Shape: c.Shape}
}

// PairGroup converts the counts of the pairs between two classes.
func PairGroup(g *replica.PairGroup) api.PairGroup {
	out := api.PairGroup{
		PrefillClass: GeometryClass(g.Prefill), DecodeClass: GeometryClass(g.Decode),
		Prefills: g.Prefills, Decodes: g.Decodes, Pairs: g.Pairs, Compatible: g.Verdict.Compatible,
		Routable: g.Routable, Quarantined: g.Quarantined, Reason: Opt(g.Verdict.Reason),
	}
	if g.Verdict.Path != "" {
		path := api.PairGroupPath(g.Verdict.Path)
		out.Path = &path
	}
	return out
}

// FleetCounts converts the counts of a fleet summary; the caller adds who
// answers (replica, store, version) and the router's breakers.
func FleetCounts(c *replica.FleetCounts) api.FleetSummary {
	out := api.FleetSummary{
		Peers: c.Peers, ByRole: map[string]int{}, ByState: map[string]int{}, Models: make([]api.FleetModel, len(c.Models)),
		Pairs: api.FleetPairs{Total: c.Pairs, Routable: c.Routable, Quarantined: c.Quarantined},
	}
	for r, n := range c.ByRole {
		out.ByRole[string(r)] = n
	}
	for s, n := range c.ByState {
		out.ByState[string(s)] = n
	}
	for i, m := range c.Models {
		out.Models[i] = api.FleetModel{Model: m.Model, Peers: m.Peers, Ready: m.Ready, Prefills: m.Prefills, Decodes: m.Decodes}
	}
	return out
}
