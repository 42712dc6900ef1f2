package apiconv

import (
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
)

// Preflight converts a reported preflight of the pair (prefill, decode),
// naming the field of a value that cannot be converted.
func Preflight(prefillID, decodeID string, b *api.PairPreflight) (registry.Preflight, error) {
	kind, err := registry.ParseMemKind(string(b.MemKind))
	if err != nil {
		return registry.Preflight{}, &registry.FieldError{Field: "mem_kind", Detail: err.Error()}
	}
	return registry.Preflight{
		PrefillID: prefillID, DecodeID: decodeID, State: registry.PreflightState(b.State),
		Backend: b.Backend, MemKind: kind, GBps: b.Gbps, LatencyUS: b.LatencyUs,
		CheckedAt: b.CheckedAt.UTC(), Error: Deref(b.Error),
	}, nil
}

// PairPreflight converts a recorded preflight; current says whether it was
// of both peers' current registrations.
func PairPreflight(pf *registry.Preflight, current bool) api.PairPreflight {
	return api.PairPreflight{
		State: api.PairPreflightState(pf.State), Backend: pf.Backend, MemKind: api.MemKind(pf.MemKind.String()),
		Gbps: pf.GBps, LatencyUs: pf.LatencyUS, CheckedAt: pf.CheckedAt, Error: Opt(pf.Error), Current: Opt(current),
	}
}

// Probe converts a published probe of the peer, naming the field of a value
// that cannot be converted.
func Probe(peerID string, b *api.Probe) (registry.Probe, error) {
	kind, err := registry.ParseMemKind(string(b.MemKind))
	if err != nil {
		return registry.Probe{}, &registry.FieldError{Field: "mem_kind", Detail: err.Error()}
	}
	return registry.Probe{
		PeerID: peerID, AgentName: b.AgentName, Backend: b.Backend, MemKind: kind, Metadata: b.Metadata,
		Addr: b.Addr, Len: b.Len, DevID: Deref(b.DevId), TransferSecret: Deref(b.TransferSecret),
	}, nil
}

// ProbeOut converts a recorded probe for the wire, transfer secret
// included: only callers allowed to read it may be given it.
func ProbeOut(p *registry.Probe) api.Probe {
	out := api.Probe{
		AgentName: p.AgentName, Backend: p.Backend, MemKind: api.MemKind(p.MemKind.String()), Metadata: p.Metadata,
		Addr: p.Addr, Len: p.Len, DevId: Opt(p.DevID), Generation: Opt(p.Generation), UpdatedAt: Opt(p.UpdatedAt),
	}
	if len(p.TransferSecret) > 0 {
		out.TransferSecret = &p.TransferSecret
	}
	return out
}
