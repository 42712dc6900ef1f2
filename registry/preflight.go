package registry

import (
	"context"
	"fmt"
	"math"
	"time"
)

// PreflightState is the outcome of a pair's preflight.
type PreflightState string

// Preflight states.
const (
	PreflightPassed PreflightState = "passed"
	PreflightFailed PreflightState = "failed"
)

// Preflight is the last preflight of a (prefill, decode) pair: the
// prefill's agent wrote a pattern into the decode agent's probe region,
// read it back and compared it, over a size ladder. A failed preflight of
// the peers' current generations keeps the pair out of routing with Error
// as its reason; a re-registration of either peer (a heal) sets it aside
// until the pair is preflighted again.
type Preflight struct {
	PrefillID string
	DecodeID  string
	State     PreflightState
	Backend   string  // "nixl" or "tcp"
	MemKind   MemKind // the probe regions' memory kind
	GBps      float64 // throughput at the largest size that passed
	LatencyUS float64 // fastest WRITE of the smallest size, in µs
	CheckedAt time.Time
	Error     string // the backend's error; empty when passed
	// PrefillGeneration and DecodeGeneration are the peers' generations
	// when the result was recorded; the store sets them.
	PrefillGeneration int64
	DecodeGeneration  int64
}

// Failed reports whether the preflight failed.
func (p Preflight) Failed() bool { return p.State == PreflightFailed }

// Current reports whether the preflight was of the peers as they are now
// (neither re-registered since).
func (p Preflight) Current(prefill, decode *Peer) bool {
	return p.PrefillGeneration == prefill.Generation && p.DecodeGeneration == decode.Generation
}

// Preflight field limits. MaxPreflightError is in characters, for
// reporters that cut an error to fit (CleanText).
const (
	MaxPreflightError   = 2048
	maxPreflightBackend = 32
)

// ValidatePreflight checks a reported preflight, naming the bad field as
// the API spells it.
func ValidatePreflight(p Preflight) error {
	switch {
	case !IsPeerID(p.PrefillID):
		return fieldErr("prefill_id", "not a peer id")
	case !IsPeerID(p.DecodeID):
		return fieldErr("decode_id", "not a peer id")
	case p.PrefillID == p.DecodeID:
		return fieldErr("decode_id", "a peer does not preflight itself")
	case p.State != PreflightPassed && p.State != PreflightFailed:
		return fieldErr("state", "must be passed or failed")
	case p.State == PreflightFailed && p.Error == "":
		return fieldErr("error", "a failed preflight names its error")
	case !p.MemKind.Valid():
		return fieldErr("mem_kind", "unknown memory kind %d", int(p.MemKind))
	case badMeasure(p.GBps):
		return fieldErr("gbps", "must be a finite number >= 0")
	case badMeasure(p.LatencyUS):
		return fieldErr("latency_us", "must be a finite number >= 0")
	}
	// Text the store keeps: held to the registry's text rules, so that a
	// NUL or invalid UTF-8 is the reporter's 400, not the database's 500
	// (which an agent would take for a control plane gone).
	if err := checkText("error", p.Error, optional, MaxPreflightError, freeText); err != nil {
		return err
	}
	return checkText("backend", p.Backend, required, maxPreflightBackend, lineText)
}

func badMeasure(v float64) bool { return v < 0 || math.IsNaN(v) || math.IsInf(v, 0) }

// PreflightReason is the reason a failed preflight gives for keeping its
// pair out of routing.
func PreflightReason(p Preflight) string {
	return fmt.Sprintf("preflight failed (%s, %s): %s", p.Backend, p.MemKind, p.Error)
}

// PreflightStore records preflights. Both stores implement it as part of
// Store.
type PreflightStore interface {
	// ReportPreflight records p as its pair's last preflight, stamped with
	// both peers' current generations, and announces the change. Either
	// peer missing: ErrNotFound.
	ReportPreflight(ctx context.Context, p Preflight) (Preflight, error)
	// Preflights lists the last preflight of every pair whose peers both
	// exist.
	Preflights(ctx context.Context) ([]Preflight, error)
	// PublishProbe records the peer's probe, replacing the previous one,
	// stamped with the peer's generation. Unknown peer: ErrNotFound.
	PublishProbe(ctx context.Context, p Probe) (Probe, error)
	// Probe returns the peer's probe; none published: ErrNotFound.
	Probe(ctx context.Context, peerID string) (Probe, error)
}

// Probe is what a peer's agent publishes about its probe region so that
// other agents can preflight it: its transfer agent, the agent's metadata,
// the registered region, and (TCP backend) the agent's transfer secret,
// which the control plane hands only to authenticated peers.
type Probe struct {
	PeerID         string
	AgentName      string
	Backend        string
	MemKind        MemKind
	Metadata       []byte
	Addr           uint64
	Len            uint64
	DevID          uint64
	TransferSecret []byte
	// Generation is the peer's generation when the probe was published;
	// the store sets it, and UpdatedAt.
	Generation int64
	UpdatedAt  time.Time
}

// Probe field limits.
const (
	maxProbeMetadata = MaxAgentMetadata // a probe carries the same agent's metadata
	maxProbeAgent    = 253
)

// ValidateProbe checks a published probe, naming the bad field as the API
// spells it.
func ValidateProbe(p Probe) error {
	switch {
	case !IsPeerID(p.PeerID):
		return fieldErr("id", "not a peer id")
	case !p.MemKind.Valid():
		return fieldErr("mem_kind", "unknown memory kind %d", int(p.MemKind))
	case len(p.Metadata) == 0 || len(p.Metadata) > maxProbeMetadata:
		return fieldErr("metadata", "required, at most %d bytes (%d of base64)", maxProbeMetadata, base64Len(maxProbeMetadata))
	case p.Len == 0 || p.Addr+p.Len < p.Addr:
		return fieldErr("region.len", "must be positive and not wrap around")
	case len(p.TransferSecret) != 0 && (len(p.TransferSecret) < MinTransferSecret || len(p.TransferSecret) > MaxTransferSecret):
		return fieldErr("transfer_secret", "must be %d to %d bytes", MinTransferSecret, MaxTransferSecret)
	}
	if err := checkText("agent_name", p.AgentName, required, maxProbeAgent, lineText); err != nil {
		return err
	}
	return checkText("backend", p.Backend, required, maxPreflightBackend, lineText)
}
