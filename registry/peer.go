package registry

import "time"

// Role says which half of a PD split a peer serves.
type Role string

// Roles.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
	RoleBoth    Role = "both"
)

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r == RolePrefill || r == RoleDecode || r == RoleBoth }

// Prefills reports whether a peer of this role can serve the prefill leg.
func (r Role) Prefills() bool { return r == RolePrefill || r == RoleBoth }

// Decodes reports whether a peer of this role can serve the decode leg.
func (r Role) Decodes() bool { return r == RoleDecode || r == RoleBoth }

// Engine names the engine protocol a peer speaks. The simulator speaks
// SGLang's protocol when registered as EngineSim.
type Engine string

// Engines.
const (
	EngineSGLang Engine = "sglang"
	EngineVLLM   Engine = "vllm"
	EngineSim    Engine = "sim"
)

// Valid reports whether e is a known engine.
func (e Engine) Valid() bool { return e == EngineSGLang || e == EngineVLLM || e == EngineSim }

// Protocol is the PD protocol the router must speak to the engine.
func (e Engine) Protocol() Engine {
	if e == EngineSim {
		return EngineSGLang
	}
	return e
}

// State is where a peer is in its life cycle.
type State string

// States. A peer is routable only while StateReady.
const (
	StatePending  State = "pending"  // registered, no heartbeat yet
	StateReady    State = "ready"    // heartbeating; routable
	StateStale    State = "stale"    // a transfer to it failed; waiting for re-registration
	StateDraining State = "draining" // an operator asked it to take no new work
	StateFailed   State = "failed"   // heartbeats stopped for its lease
	// StateUnhealthy: its agent heartbeats, but the agent's probes of the
	// engine fail; out of routing until the probes pass again.
	StateUnhealthy State = "unhealthy"
)

// States lists every state, in life-cycle order.
func States() []State {
	return []State{StatePending, StateReady, StateUnhealthy, StateStale, StateDraining, StateFailed}
}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	switch s {
	case StatePending, StateReady, StateStale, StateDraining, StateFailed, StateUnhealthy:
		return true
	}
	return false
}

// DefaultBootstrapPort is SGLang's default disaggregation bootstrap port.
const DefaultBootstrapPort = 8998

// Parallelism is how an engine splits the model over devices.
type Parallelism struct {
	TPSize     int
	AttnTPSize int
	DPSize     int
	PPSize     int
	PPRank     int
	DCPSize    int
	DCPRank    int
}

// KVGeometry is the shape of a peer's KV cache, common to all its ranks.
type KVGeometry struct {
	PageSize   int
	DType      string
	NumLayers  int
	NumKVHeads int
	HeadDim    int
	IsMLA      bool
}

// Rank is one device's share of a peer's KV cache, with the NIXL agent that
// owns it. Region i is KVDataPtrs[i] .. KVDataPtrs[i]+KVDataLens[i] and lives
// in memory of kind KVMemKinds[i].
type Rank struct {
	Rank          int
	GPUID         int
	AgentName     string
	AgentMetadata []byte
	KVDataPtrs    []uint64
	KVDataLens    []uint64
	KVItemLens    []uint64
	KVMemKinds    []MemKind
	AuxDataPtrs   []uint64
	AuxDataLens   []uint64
	// TransferSecret authenticates connections to the rank's transfer agent
	// (the TCP backend's HMAC handshake). The agent draws it for each agent
	// name, so each generation has its own; the control plane hands it only
	// to authenticated peers, never to anonymous readers.
	TransferSecret []byte
}

// KVEvents is an engine's KV events publisher: a ZMQ PUB endpoint, the
// ROUTER endpoint that replays what it still holds, and the topic its
// messages carry. Endpoints are "tcp://HOST:PORT".
type KVEvents struct {
	Endpoint       string
	ReplayEndpoint string
	Topic          string
}

// Load is what a peer reports about its own work on each heartbeat.
type Load struct {
	Running int
	Queued  int
	KVUsage float64
}

// PeerSpec is what an agent registers: everything about a peer that the
// engine decides, none of what the control plane decides.
type PeerSpec struct {
	Name          string
	Role          Role
	Engine        Engine
	URL           string
	BootstrapHost string
	BootstrapPort int
	Model         string
	InstanceID    string
	TransferGroup string
	Labels        map[string]string
	Parallelism   Parallelism
	KV            KVGeometry
	// KVEvents is where the engine publishes its KV cache events, when it
	// does (vLLM's and SGLang's --kv-events-config): router replicas
	// subscribe there to learn which prefixes the engine holds. Zero: it
	// publishes none, and KV-cache-aware routing falls back for it.
	KVEvents KVEvents
	// Ranks is empty when "ranks" is Unknown: a stock engine publishes no
	// NIXL agent names, pointers or regions, and moves its KV itself.
	Ranks []Rank
	// Observed lists the fields read from the engine itself; Unknown the
	// fields nobody could tell (see UnknownableFields). Every other field
	// was declared (a spec file, flags).
	Observed []string
	Unknown  []string
}

// Provenance says where a field's value came from.
type Provenance string

// Provenances.
const (
	Observed Provenance = "observed" // read from the engine
	Declared Provenance = "declared" // a spec file or flags
	Unknown  Provenance = "unknown"  // nobody could tell; the field holds its zero value
)

// Registration field paths that a provenance list may name.
const (
	FieldRanks      = "ranks"
	FieldNumLayers  = "kv.num_layers"
	FieldNumKVHeads = "kv.num_kv_heads"
	FieldHeadDim    = "kv.head_dim"
	FieldIsMLA      = "kv.is_mla"
)

// UnknownableFields are the fields a registration may leave unknown: what
// a stock engine does not publish (its NIXL agents and KV regions) and what
// only the model's config.json tells. Everything pairing cannot do without
// (model, role, page size, dtype, parallelism) must be known.
func UnknownableFields() []string {
	return []string{FieldNumLayers, FieldNumKVHeads, FieldHeadDim, FieldIsMLA, FieldRanks}
}

// ProvenanceFields are the field paths Observed may name.
func ProvenanceFields() []string {
	return append([]string{"role", "engine", "url", "bootstrap_host", "bootstrap_port", "model", "instance_id",
		"parallelism.tp_size", "parallelism.attn_tp_size", "parallelism.dp_size", "parallelism.pp_size",
		"parallelism.pp_rank", "parallelism.dcp_size", "parallelism.dcp_rank", "kv.page_size", "kv.dtype"},
		UnknownableFields()...)
}

// Provenance says where the spec's field (a path of ProvenanceFields) came
// from.
func (s *PeerSpec) Provenance(field string) Provenance {
	switch {
	case contains(s.Unknown, field):
		return Unknown
	case contains(s.Observed, field):
		return Observed
	}
	return Declared
}

// Knows reports whether the field's value is known (observed or declared).
func (s *PeerSpec) Knows(field string) bool { return !contains(s.Unknown, field) }

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// Peer is a registered engine instance: its spec plus the control plane's view
// of its life.
type Peer struct {
	PeerSpec
	ID            string
	State         State
	StateReason   string
	Generation    int64
	LeaseExpiry   time.Time
	LastHeartbeat *time.Time
	Load          Load
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// Heal is the peer's heal plan (see heal.go), and its recent heals.
	Heal Heal
	// CredentialHash is the hash of the credential the peer's agent holds
	// (see NewCredential); empty for a peer registered while the control
	// plane ran open. It never leaves the control plane.
	CredentialHash []byte
}

// Live reports whether the peer still holds what it registered (its name,
// its NIXL agent names): until it fails or its lease runs out, even if the
// sweeper has not run yet.
func (p *Peer) Live(now time.Time) bool { return p.State != StateFailed && !now.After(p.LeaseExpiry) }

// Routable reports whether the router may send work to the peer.
func (p *Peer) Routable() bool { return p.State == StateReady }

// AgentNames lists the NIXL agent names of the peer's ranks, in rank order.
func (p *PeerSpec) AgentNames() []string {
	names := make([]string, len(p.Ranks))
	for i, r := range p.Ranks {
		names[i] = r.AgentName
	}
	return names
}

// HasAgent reports whether one of the peer's ranks is the NIXL agent name.
func (p *PeerSpec) HasAgent(name string) bool {
	for i := range p.Ranks {
		if p.Ranks[i].AgentName == name {
			return true
		}
	}
	return false
}

// NeedsNewGeneration reports whether registering next over prev starts a new
// generation: the process restarted or a rank's NIXL agent changed name, so
// every holder of the old agent metadata must drop it.
func NeedsNewGeneration(prev, next *PeerSpec) bool {
	if prev.InstanceID != next.InstanceID || len(prev.Ranks) != len(next.Ranks) {
		return true
	}
	for i := range prev.Ranks {
		if prev.Ranks[i].AgentName != next.Ranks[i].AgentName {
			return true
		}
	}
	return false
}

// EventKind names an entry of the append-only event log.
type EventKind string

// Event kinds.
const (
	EventRegistered          EventKind = "registered"
	EventReady               EventKind = "ready"
	EventStale               EventKind = "stale"
	EventReregisterRequested EventKind = "reregister_requested"
	EventReregistered        EventKind = "reregistered"
	EventExpired             EventKind = "expired"
	EventDrained             EventKind = "drained"
	EventRemoved             EventKind = "removed"
	EventQuarantined         EventKind = "quarantined"
	EventUnhealthy           EventKind = "unhealthy"
)

// Event is one entry of the event log. IDs grow with time, so they double as
// a pagination cursor.
type Event struct {
	ID         int64
	PeerID     string
	PeerName   string
	Kind       EventKind
	Generation int64
	Message    string
	Error      string
	At         time.Time
}

// PeerLoad is a peer's load as its last heartbeat reported it.
type PeerLoad struct {
	PeerID string
	Load   Load
	At     time.Time // the heartbeat that carried it
}

// ReportedLoad returns the load the peer's record carries, from its last
// heartbeat as the record was read; ok is false (and only PeerID set) when
// the record has none.
func (p *Peer) ReportedLoad() (l PeerLoad, ok bool) {
	if p.LastHeartbeat == nil {
		return PeerLoad{PeerID: p.ID}, false
	}
	return PeerLoad{PeerID: p.ID, Load: p.Load, At: *p.LastHeartbeat}, true
}
