package registry

import (
	"fmt"
	"slices"
	"time"
)

// The functions in this file are the life-cycle rules of a peer, written once
// as pure functions so that every store applies exactly the same transitions.
// Each returns the next peer and the events to append (ID and At unset).

// ReasonLeaseExpired is the state reason of a peer whose heartbeats stopped.
const ReasonLeaseExpired = "lease expired: heartbeats stopped"

// ReasonSameAgentName is the stale reason kept when a stale peer re-registers
// without a fresh NIXL agent name: SGLang ignores a re-registration under a
// name it has seen, so nothing would be fixed.
const ReasonSameAgentName = "re-registered under the same NIXL agent name; a fresh agent name is required to clear a stale mark"

// Reregister applies a registration of spec over the existing peer prev.
// It keeps the peer's ID, bumps the generation when the instance or an agent
// name changed, and reports whether quarantines naming the peer must be
// cleared because its geometry changed.
func Reregister(prev Peer, spec PeerSpec, now time.Time, leaseTTL time.Duration) (next Peer, events []Event, clearQuarantine bool) {
	next = prev
	next.PeerSpec = spec
	next.UpdatedAt = now
	next.LeaseExpiry = now.Add(leaseTTL)
	clearQuarantine = CompatKey(&prev.PeerSpec) != CompatKey(&spec)
	if !NeedsNewGeneration(&prev.PeerSpec, &spec) {
		if prev.State == StateStale {
			next.StateReason = ReasonSameAgentName
		}
		if prev.State == StateFailed {
			next.State, next.StateReason = StatePending, ""
		}
		return next, []Event{{Kind: EventRegistered, Message: "registration updated"}}, clearQuarantine
	}
	next.Generation = prev.Generation + 1
	var healEvents []Event
	if prev.Heal.Active() {
		healEvents = healed(prev, &next)
	}
	// A peer that was alive a moment ago (stale, or ready and restarted)
	// goes straight back to ready: its agent just proved itself by
	// re-registering, and waiting a heartbeat would keep it out of routing
	// for no reason.
	alive := prev.LastHeartbeat != nil && now.Before(prev.LeaseExpiry)
	switch {
	case prev.State == StateDraining:
	case alive && (prev.State == StateReady || prev.State == StateStale):
		next.State, next.StateReason = StateReady, ""
	default:
		next.State, next.StateReason = StatePending, ""
	}
	msg := fmt.Sprintf("generation %d → %d", prev.Generation, next.Generation)
	if prev.InstanceID != spec.InstanceID {
		msg += ", new instance " + spec.InstanceID
	}
	return next, append([]Event{{Kind: EventReregistered, Message: msg}}, healEvents...), clearQuarantine
}

// NewPeer is the peer a first registration creates.
func NewPeer(id string, spec PeerSpec, now time.Time, leaseTTL time.Duration) (Peer, []Event) {
	p := Peer{PeerSpec: spec, ID: id, State: StatePending, Generation: 1,
		LeaseExpiry: now.Add(leaseTTL), CreatedAt: now, UpdatedAt: now}
	return p, []Event{{Kind: EventRegistered, Message: "registered"}}
}

// ApplyHeartbeat applies an agent's heartbeat. The agent's verdict on its
// engine decides between ready and unhealthy: a ready (or pending, or
// failed) peer whose engine is down becomes unhealthy, with the probe error
// as its reason, and an unhealthy one becomes ready when its engine is back.
// A stale peer's heartbeat advances its heal plan (heal.go); a drained peer
// stays out of routing until an operator acts.
func ApplyHeartbeat(prev Peer, hb Heartbeat, now time.Time, leaseTTL time.Duration, heal HealConfig) (next Peer, reply HeartbeatReply, events []Event) {
	next = prev
	next.Load = hb.Load
	t := now
	next.LastHeartbeat = &t
	next.LeaseExpiry = now.Add(leaseTTL)
	reply = HeartbeatReply{Action: ActionNone}
	switch {
	case hb.InstanceID != prev.InstanceID:
		reply = HeartbeatReply{Action: ActionReregister, Reason: "instance changed: registered " + prev.InstanceID + ", heartbeat from " + hb.InstanceID}
	case holdOver(&prev, now):
		// The quarantined phase's hold is over: the decode drains.
		events = drainHeal(&next, "hold over", now, heal)
	case prev.State == StateStale:
		reply, events = healHeartbeat(&next, hb, now, heal)
		if next.State != prev.State || next.Heal.Phase != prev.Heal.Phase {
			next.UpdatedAt = now
		}
	case HealFailed(prev):
		// A heal that failed (the action, its verification, the hourly
		// limit) waits for an operator: the engine is still broken, and
		// routing to it again would start the next heal. A new instance
		// (a registration at a new generation) or an operator's action
		// clears it.
	case prev.State == StateDraining || prev.State == StateUnhealthy && hb.EngineDown:
	case hb.EngineDown:
		next.State, next.StateReason, next.UpdatedAt = StateUnhealthy, UnhealthyReason(hb.EngineError), now
		events = []Event{{Kind: EventUnhealthy, Message: "engine probes failing", Error: hb.EngineError}}
	case prev.State == StateUnhealthy:
		next.State, next.StateReason, next.UpdatedAt = StateReady, "", now
		events = []Event{{Kind: EventReady, Message: "engine probes passing again"}}
	case prev.State == StatePending || prev.State == StateFailed:
		next.State, next.StateReason, next.UpdatedAt = StateReady, "", now
		events = []Event{{Kind: EventReady, Message: "first heartbeat"}}
	}
	reply.State = next.State
	return next, reply, events
}

// HealFailed reports whether the peer is failed for a reason its
// heartbeats cannot undo: every failure but a lease that ran out (which
// heartbeats that come back do undo) is a failed heal.
func HealFailed(p Peer) bool {
	return p.State == StateFailed && p.StateReason != ReasonLeaseExpired
}

// UnhealthyReason is the state reason of a peer whose engine's probes fail.
func UnhealthyReason(probeErr string) string {
	if probeErr == "" {
		return "engine unhealthy"
	}
	return "engine unhealthy: " + probeErr
}

// ApplyStale marks a peer stale and starts its heal plan (heal.go), or
// fails it when it has used up its heals for the hour. Marking a peer that
// is already healing again only logs the new error; one whose plan holds
// in the quarantined phase drains at once, keeping its plan.
func ApplyStale(prev Peer, reason, errText string, now time.Time, heal HealConfig) (Peer, []Event) {
	next := prev
	if reason == "" {
		reason = "marked stale"
	}
	next.State, next.StateReason, next.UpdatedAt = StateStale, reason, now
	events := []Event{{Kind: EventStale, Message: reason, Error: errText}}
	if prev.State == StateStale && prev.Heal.Active() {
		return next, events
	}
	if prev.Heal.Phase == HealQuarantined {
		events = append(events, drainHeal(&next, "marked stale", now, heal)...)
		next.StateReason = reason
		return next, events
	}
	return next, append(events, startHeal(&next, reason, now, heal)...)
}

// ReportedBy is the stale reason as the event log keeps it: the reason and
// who reported it (a peer's name, "admin", "router:<replica>").
func ReportedBy(reason, reporter string) string {
	if reporter == "" {
		return reason
	}
	if reason == "" {
		reason = "marked stale"
	}
	return reason + " (reported by " + reporter + ")"
}

// ApplyDrain stops new work from going to a peer.
func ApplyDrain(prev Peer, now time.Time) (Peer, []Event) {
	next := prev
	next.State, next.StateReason, next.UpdatedAt = StateDraining, "drained by operator", now
	return next, []Event{{Kind: EventDrained, Message: "drained by operator"}}
}

// HoldsLease reports whether a peer in state st needs heartbeats to keep
// it: a pending, ready, stale or unhealthy peer (its agent is expected to
// heartbeat) fails when its lease runs out; a draining or failed one does
// not.
func HoldsLease(st State) bool {
	return st == StateReady || st == StatePending || st == StateStale || st == StateUnhealthy
}

// Expired reports whether the peer's lease has run out in a state where
// that matters, and returns the failed peer.
func Expired(prev Peer, now time.Time) (Peer, []Event, bool) {
	if !now.After(prev.LeaseExpiry) || !HoldsLease(prev.State) {
		return prev, nil, false
	}
	next := prev
	next.State, next.StateReason, next.UpdatedAt = StateFailed, ReasonLeaseExpired, now
	return next, []Event{{Kind: EventExpired, Message: ReasonLeaseExpired}}, true
}

// TransferFailureChanged reports whether applying a transfer failure
// (ApplyTransferFailure, ApplyPairTransferFailure) changed the decode or its
// pairs: events to record, or a quarantine. Only then do the stores write
// the decode and announce the change: a repeated report of a pair already
// held changes nothing, and every router retrying on that pair would
// otherwise make every replica read the decode again.
func TransferFailureChanged(events []Event, q *Quarantine) bool { return len(events) > 0 || q != nil }

// ApplyTransferFailure decides what a failed transfer to decode means.
// last is the pair's previous failure, if any; others counts the other
// prefills that can use the decode now (OtherPrefills). Every replica and
// every reporter (routers reading a prefill's 500, prefill-side transfer
// workers) goes through this one rule, so duplicates collapse and a
// deterministic repeat quarantines the pair instead of looping through
// stale marks.
//
// A first failure of a pair starts the decode's heal plan (heal.go) with
// the pair quarantined and the decode still serving the others; with no
// others, or no prefill named, the decode goes stale at once. A failure
// of another pair while the plan holds joins it, and drains the decode at
// once when that leaves no other prefill to serve.
func ApplyTransferFailure(decode Peer, f TransferFailure, last *PairFailure, now time.Time, window time.Duration, heal HealConfig, others int) (next Peer, events []Event, q *Quarantine, rec *PairFailure, out TransferOutcome) {
	if f.DecodeAgent != "" && !decode.HasAgent(f.DecodeAgent) {
		return decode, nil, nil, nil, OutcomeOutdated
	}
	if decode.State == StateStale {
		return decode, nil, nil, nil, OutcomeAlreadyStale
	}
	if f.PrefillID != "" && decode.Heal.Phase == HealQuarantined {
		if slices.Contains(decode.Heal.Pairs, f.PrefillID) {
			return decode, nil, nil, nil, OutcomeHealPending
		}
		next = decode
		joinHeal(&next, f.PrefillID, now)
		q = healQuarantine(&next, f, now)
		if others == 0 {
			// No prefill can use the decode any more: holding serves
			// nobody.
			return next, drainHeal(&next, "no other prefill can use the decode", now, heal), q, pairFailure(&decode, f, now), OutcomeStale
		}
		return next, nil, q, pairFailure(&decode, f, now), OutcomeHealPending
	}
	if f.PrefillID != "" && last != nil && last.DecodeGeneration < decode.Generation && now.Sub(last.At) <= window {
		return decode, nil, &Quarantine{PrefillID: f.PrefillID, DecodeID: decode.ID, At: now}, nil, OutcomeQuarantined
	}
	if f.PrefillID != "" && others > 0 {
		next = decode
		if events, ok := holdHeal(&next, f.PrefillID, ReportedBy(f.Reason, f.Reporter), now, heal); ok {
			return next, events, healQuarantine(&next, f, now), pairFailure(&decode, f, now), OutcomeHealPending
		}
	}
	next, events = ApplyStale(decode, ReportedBy(f.Reason, f.Reporter), f.Error, now, heal)
	if f.PrefillID != "" {
		rec = pairFailure(&decode, f, now)
	}
	return next, events, nil, rec, OutcomeStale
}

// pairFailure is the record of f's failure of the pair with decode.
func pairFailure(decode *Peer, f TransferFailure, now time.Time) *PairFailure {
	return &PairFailure{PrefillID: f.PrefillID, DecodeID: decode.ID, DecodeGeneration: decode.Generation, At: now}
}

// healQuarantine is the quarantine of f's pair that decode's heal plan
// makes; the caller sets its expiry.
func healQuarantine(decode *Peer, f TransferFailure, now time.Time) *Quarantine {
	what := ReportedBy(f.Reason, f.Reporter)
	if what == "" {
		what = "transfer failed"
	}
	return &Quarantine{PrefillID: f.PrefillID, DecodeID: decode.ID, At: now, Detail: fmt.Sprintf(
		"heal pending: %s; the pair stays out of routing until the decode restarts with a fresh agent, while other prefills keep using it",
		what)}
}

// OtherPrefills counts the prefills, among prefills and other than
// exclude, that may send to decode now: routable, a compatible pair, and
// the pair not quarantined (quarantined reports an active quarantine).
func OtherPrefills(decode *Peer, exclude string, prefills []Peer, quarantined func(prefillID string) bool) int {
	n := 0
	for i := range prefills {
		p := &prefills[i]
		if p.ID == exclude || p.ID == decode.ID || !p.Routable() || quarantined(p.ID) {
			continue
		}
		if CheckPair(&p.PeerSpec, &decode.PeerSpec).Compatible {
			n++
		}
	}
	return n
}

// QuarantineDetail explains a quarantine: what failed, and how the two
// geometries differ.
func QuarantineDetail(prefill, decode *Peer, errText string) string {
	if errText == "" {
		errText = "transfer failed"
	}
	return fmt.Sprintf("failed again right after %s re-registered (generation %d): %s; geometry: %s",
		decode.Name, decode.Generation, errText, GeometryDiff(&prefill.PeerSpec, &decode.PeerSpec))
}

// DrainSafe is the rule for when a draining peer may be stopped: it is
// draining, its engine's load, reported by a heartbeat after the drain
// began (UpdatedAt), shows no request running or queued, and inFlight,
// the requests a router holds with it in either role (the KV handoff
// between a prefill and its decode included), is zero. reason says what
// is still missing.
func DrainSafe(p *Peer, inFlight int64) (safe bool, reason string) {
	switch {
	case p.State != StateDraining:
		return false, "the peer is " + string(p.State) + ", not draining"
	case inFlight > 0:
		return false, fmt.Sprintf("%d requests in flight through this replica", inFlight)
	case p.LastHeartbeat == nil || !p.LastHeartbeat.After(p.UpdatedAt):
		return false, "waiting for the engine's load, reported after the drain began"
	case p.Load.Running > 0 || p.Load.Queued > 0:
		return false, fmt.Sprintf("the engine reports %d requests running and %d queued", p.Load.Running, p.Load.Queued)
	}
	return true, ""
}
