package registry

import (
	"fmt"
	"slices"
	"time"
)

// The heal plan. A decode that a transfer failure says is broken cannot
// be fixed by asking it to re-register: a real SGLang decode keeps its NIXL
// agent (a uuid4 made at start) until its process restarts, and the
// prefill ignores a re-registration under that name. So the registry runs
// a plan, one step at a time, each with a deadline, and never loops:
//
//  0. quarantined: SGLang's broken entry is per (prefill, decode agent),
//     so the first failure quarantines only the failing pair; the decode
//     stays ready and every other prefill whose pair is healthy keeps
//     using it. Further pairs of the decode that fail meanwhile join the
//     same plan (quarantined too; no second plan). The phase holds for
//     HealConfig.Hold, then moves to draining. It holds rather than
//     draining at once because the restart is expensive (minutes of model
//     load on a real fleet, and every stream on the decode must end
//     first): the hold gathers which pairs are broken and how, while the
//     decode keeps serving the prefills that can reach it. A decode that
//     no other prefill can use skips the hold, or ends it when the last
//     one fails: it would serve nobody.
//  1. draining: the peer is out of routing (stale); requests in flight on
//     it finish. The step ends when a heartbeat reports the engine idle or
//     when the drain grace is over.
//  2. acting: that heartbeat's answer tells the agent, once, to run its heal
//     action (restart the engine: exec, systemd, Kubernetes); the plan moves
//     to verifying at once, so no later answer repeats it.
//  3. verifying: the plan waits for the engine's new instance, a
//     registration at generation + 1 with a fresh agent. It brings the peer
//     back to ready and lifts the quarantines the plan made: the new agent
//     has no broken entry. The pairs' failure records stay, so a pair that
//     fails again right after the heal is quarantined with the geometry
//     difference (ApplyTransferFailure). A heal action that reports
//     failure, or no new instance by the verify deadline, marks the peer
//     failed with the reason; an operator acts, and the plan's quarantines
//     keep their expiry, trial and lift.
//
// The steps move on the decode's heartbeats and, so that a plan cannot
// hang when heartbeats stop, on the lease sweeper (ExpireHeal). At most
// MaxPerHour heals start per peer and hour; past that the peer fails
// instead of healing again.

// HealPhase is the step a peer's heal plan is at; empty when none runs.
type HealPhase string

// Heal phases.
const (
	HealQuarantined HealPhase = "quarantined"
	HealDraining    HealPhase = "draining"
	HealVerifying   HealPhase = "verifying"
)

// Heal is a peer's heal plan, and when its recent heals started.
type Heal struct {
	Phase  HealPhase
	Reason string // why the plan started
	// FromGeneration is the generation that failed; the plan verifies a
	// later one.
	FromGeneration int64
	Started        time.Time // when the plan started
	Acted          time.Time // when the agent was told to act
	Deadline       time.Time // when the current phase runs out
	// Recent holds when the heals of the last hour started, oldest first.
	Recent []time.Time
	// Pairs are the prefills whose pairs with the peer the plan
	// quarantined, in the order they failed; a heal lifts them.
	Pairs []string
}

// Active reports whether a heal plan is running.
func (h *Heal) Active() bool { return h.Phase != "" }

// HealConfig is the heal plan's timing and limit.
type HealConfig struct {
	// Hold is how long the quarantined phase keeps the decode serving its
	// healthy pairs before it drains.
	Hold time.Duration
	// DrainGrace bounds how long requests in flight may take to finish
	// before the heal action runs.
	DrainGrace time.Duration
	// VerifyTimeout bounds how long the engine may take to come back as a
	// new instance after the action.
	VerifyTimeout time.Duration
	// MaxPerHour is how many heals may start per peer within an hour.
	MaxPerHour int
}

// Heal defaults.
const (
	DefaultHealHold          = 10 * time.Second
	DefaultHealDrainGrace    = 30 * time.Second
	DefaultHealVerifyTimeout = 5 * time.Minute
	DefaultHealMaxPerHour    = 3
)

// WithDefaults fills zero fields with the defaults.
func (c HealConfig) WithDefaults() HealConfig {
	if c.Hold <= 0 {
		c.Hold = DefaultHealHold
	}
	if c.DrainGrace <= 0 {
		c.DrainGrace = DefaultHealDrainGrace
	}
	if c.VerifyTimeout <= 0 {
		c.VerifyTimeout = DefaultHealVerifyTimeout
	}
	if c.MaxPerHour <= 0 {
		c.MaxPerHour = DefaultHealMaxPerHour
	}
	return c
}

// Heal event kinds.
const (
	EventHealStarted  EventKind = "heal_started"
	EventHealDraining EventKind = "heal_draining"
	EventHealActing   EventKind = "heal_acting"
	EventHealed       EventKind = "healed"
	EventHealFailed   EventKind = "heal_failed"
)

// recentHeals returns the heals of h that started within the hour before
// now, and whether they use up the hour's limit.
func recentHeals(h *Heal, now time.Time, cfg HealConfig) ([]time.Time, bool) {
	recent := h.Recent[:0:0]
	for _, t := range h.Recent {
		if now.Sub(t) < time.Hour {
			recent = append(recent, t)
		}
	}
	return recent, len(recent) >= cfg.MaxPerHour
}

// startHeal starts next's heal plan at draining (next is already stale),
// or fails the peer when it has used up its heals for the hour.
func startHeal(next *Peer, reason string, now time.Time, cfg HealConfig) []Event {
	cfg = cfg.WithDefaults()
	h := &next.Heal
	recent, limited := recentHeals(h, now, cfg)
	if limited {
		msg := fmt.Sprintf("heal limit reached: %d heals in the last hour; an operator must act", len(recent))
		*h = Heal{Recent: recent}
		next.State, next.StateReason = StateFailed, msg
		return []Event{{Kind: EventHealFailed, Message: msg, Error: reason}}
	}
	*h = Heal{
		Phase: HealDraining, Reason: reason, FromGeneration: next.Generation,
		Started: now, Deadline: now.Add(cfg.DrainGrace), Recent: append(recent, now),
	}
	return []Event{{Kind: EventHealStarted, Message: fmt.Sprintf("heal %d of %d this hour: draining, requests in flight finish within %s",
		len(h.Recent), cfg.MaxPerHour, cfg.DrainGrace)}}
}

// holdHeal starts next's heal plan at quarantined, for the pair with
// prefillID, which the caller quarantines. ok is false, and nothing
// changes, when the peer has used up its heals for the hour.
func holdHeal(next *Peer, prefillID, reason string, now time.Time, cfg HealConfig) (events []Event, ok bool) {
	cfg = cfg.WithDefaults()
	recent, limited := recentHeals(&next.Heal, now, cfg)
	if limited {
		return nil, false
	}
	next.Heal = Heal{
		Phase: HealQuarantined, Reason: reason, FromGeneration: next.Generation,
		Started: now, Deadline: now.Add(cfg.Hold), Recent: append(recent, now), Pairs: []string{prefillID},
	}
	next.UpdatedAt = now
	return []Event{{Kind: EventHealStarted, Message: fmt.Sprintf(
		"heal %d of %d this hour: the failing pair is quarantined; the decode keeps serving its healthy pairs for %s, then drains",
		len(next.Heal.Recent), cfg.MaxPerHour, cfg.Hold)}}, true
}

// joinHeal adds the pair with prefillID to next's quarantined plan.
func joinHeal(next *Peer, prefillID string, now time.Time) {
	next.Heal.Pairs = append(slices.Clone(next.Heal.Pairs), prefillID)
	next.UpdatedAt = now
}

// drainHeal ends next's quarantined phase: the peer goes stale, out of
// routing, and the plan drains it. why says what ended the hold.
func drainHeal(next *Peer, why string, now time.Time, cfg HealConfig) []Event {
	cfg = cfg.WithDefaults()
	h := &next.Heal
	h.Phase, h.Deadline = HealDraining, now.Add(cfg.DrainGrace)
	next.State, next.StateReason, next.UpdatedAt = StateStale, h.Reason, now
	return []Event{{Kind: EventHealDraining, Message: fmt.Sprintf(
		"%s with %d pair(s) quarantined: draining, out of routing; requests in flight finish within %s",
		why, len(h.Pairs), cfg.DrainGrace)}}
}

// holdOver reports whether p's quarantined phase has run its time.
func holdOver(p *Peer, now time.Time) bool {
	return p.Heal.Phase == HealQuarantined && !now.Before(p.Heal.Deadline) && HoldsLease(p.State) && p.State != StateStale
}

// healHeartbeat is a stale peer's heartbeat: the heal plan's next step.
func healHeartbeat(next *Peer, hb Heartbeat, now time.Time, cfg HealConfig) (HeartbeatReply, []Event) {
	cfg = cfg.WithDefaults()
	h := &next.Heal
	switch h.Phase {
	case "":
		// A stale peer without a plan (marked before plans existed):
		// start one.
		return HeartbeatReply{Action: ActionNone}, startHeal(next, next.StateReason, now, cfg)
	case HealDraining:
		inFlight := hb.Load.Running + hb.Load.Queued
		if inFlight > 0 && now.Before(h.Deadline) {
			return HeartbeatReply{Action: ActionNone}, nil
		}
		msg := "drained"
		if inFlight > 0 {
			msg = fmt.Sprintf("drain grace over with %d requests in flight", inFlight)
		}
		h.Phase, h.Acted, h.Deadline = HealVerifying, now, now.Add(cfg.VerifyTimeout)
		return HeartbeatReply{Action: ActionHeal, Reason: h.Reason},
			[]Event{{Kind: EventHealActing, Message: msg + "; the agent runs its heal action"}}
	case HealVerifying:
		if hb.HealError == "" {
			return HeartbeatReply{Action: ActionNone}, nil
		}
		msg := "heal action failed: " + hb.HealError
		h.Phase = ""
		next.State, next.StateReason = StateFailed, msg
		return HeartbeatReply{Action: ActionNone}, []Event{{Kind: EventHealFailed, Message: "the heal action failed", Error: hb.HealError}}
	}
	return HeartbeatReply{Action: ActionNone}, nil
}

// healed ends next's plan on a registration of a new generation. The
// events' times tell the plan's timeline (heal_started, heal_draining,
// heal_acting, healed); the messages carry no durations, so that every
// store and replica writes the same words. The store lifts the plan's
// quarantines (HealedPairs).
func healed(prev Peer, next *Peer) []Event {
	h := prev.Heal
	next.Heal = Heal{Recent: h.Recent}
	msg := fmt.Sprintf("healed: generation %d → %d", h.FromGeneration, next.Generation)
	if h.Acted.IsZero() {
		msg += ", before the heal action ran"
	}
	return []Event{{Kind: EventHealed, Message: msg}}
}

// HealedPairs returns the prefills whose quarantines with the decode a
// registration (prev → next) ends: those its heal plan made, when the
// registration healed it with a new generation.
func HealedPairs(prev, next Peer) []string {
	if !prev.Heal.Active() || next.Generation <= prev.Generation {
		return nil
	}
	return prev.Heal.Pairs
}

// HealedLift is the event of a quarantine that a heal lifted, of the pair
// with the prefill named prefillName.
func HealedLift(prefillName string, generation int64) Event {
	return Event{Kind: EventQuarantineLifted, Message: fmt.Sprintf(
		"quarantine of the pair with prefill %s lifted: the heal brought generation %d, a new agent without the broken entry", prefillName, generation)}
}

// ExpireHeal moves a heal plan whose step ran out of time: a quarantined
// phase whose hold is over drains the peer, and a heal that did not verify
// in time (its engine did not come back as a new instance by the
// deadline) fails the peer.
func ExpireHeal(prev Peer, now time.Time, cfg HealConfig) (Peer, []Event, bool) {
	if holdOver(&prev, now) {
		next := prev
		return next, drainHeal(&next, "hold over", now, cfg), true
	}
	if prev.State != StateStale || prev.Heal.Phase != HealVerifying || !now.After(prev.Heal.Deadline) {
		return prev, nil, false
	}
	next := prev
	msg := fmt.Sprintf("heal did not verify: no new instance by the deadline after the heal action (still generation %d)", prev.Generation)
	next.Heal = Heal{Recent: prev.Heal.Recent}
	next.State, next.StateReason, next.UpdatedAt = StateFailed, msg, now
	return next, []Event{{Kind: EventHealFailed, Message: msg}}, true
}
