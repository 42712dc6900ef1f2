package registry

import (
	"fmt"
	"time"
)

// The heal plan. A decode that a transfer failure marked stale cannot be
// fixed by asking it to re-register: a real SGLang decode keeps its NIXL
// agent (a uuid4 made at start) until its process restarts, and the
// prefill ignores a re-registration under that name. So the registry runs
// a plan, one step at a time, each with a deadline, and never loops:
//
//  1. draining: the peer is out of routing (stale); requests in flight on
//     it finish. The step ends when a heartbeat reports the engine idle or
//     when the drain grace is over.
//  2. acting: that heartbeat's answer tells the agent, once, to run its heal
//     action (restart the engine: exec, systemd, Kubernetes); the plan moves
//     to verifying at once, so no later answer repeats it.
//  3. verifying: the plan waits for the engine's new instance, a
//     registration at generation + 1 with a fresh agent. It brings the peer
//     back to ready. A heal action that reports failure, or no new instance
//     by the verify deadline, marks the peer failed with the reason; an
//     operator acts.
//
// At most MaxPerHour heals start per peer and hour; past that the peer
// fails instead of healing again.

// HealPhase is the step a peer's heal plan is at; empty when none runs.
type HealPhase string

// Heal phases.
const (
	HealDraining  HealPhase = "draining"
	HealVerifying HealPhase = "verifying"
)

// Heal is a peer's heal plan, and when its recent heals started.
type Heal struct {
	Phase  HealPhase
	Reason string // why the peer went stale
	// FromGeneration is the generation that failed; the plan verifies a
	// later one.
	FromGeneration int64
	Started        time.Time // when the peer went stale
	Acted          time.Time // when the agent was told to act
	Deadline       time.Time // when the current phase runs out
	// Recent holds when the heals of the last hour started, oldest first.
	Recent []time.Time
}

// Active reports whether a heal plan is running.
func (h *Heal) Active() bool { return h.Phase != "" }

// HealConfig is the heal plan's timing and limit.
type HealConfig struct {
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
	DefaultHealDrainGrace    = 30 * time.Second
	DefaultHealVerifyTimeout = 5 * time.Minute
	DefaultHealMaxPerHour    = 3
)

// WithDefaults fills zero fields with the defaults.
func (c HealConfig) WithDefaults() HealConfig {
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
	EventHealStarted EventKind = "heal_started"
	EventHealActing  EventKind = "heal_acting"
	EventHealed      EventKind = "healed"
	EventHealFailed  EventKind = "heal_failed"
)

// startHeal starts next's heal plan (next is already stale), or fails the
// peer when it has used up its heals for the hour.
func startHeal(next *Peer, reason string, now time.Time, cfg HealConfig) []Event {
	cfg = cfg.WithDefaults()
	h := &next.Heal
	recent := h.Recent[:0:0]
	for _, t := range h.Recent {
		if now.Sub(t) < time.Hour {
			recent = append(recent, t)
		}
	}
	if len(recent) >= cfg.MaxPerHour {
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
// events' times tell the plan's timeline (stale, heal_started,
// heal_acting, healed); the messages carry no durations, so that every
// store and replica writes the same words.
func healed(prev Peer, next *Peer) []Event {
	h := prev.Heal
	next.Heal = Heal{Recent: h.Recent}
	msg := fmt.Sprintf("healed: generation %d → %d", h.FromGeneration, next.Generation)
	if h.Acted.IsZero() {
		msg += ", before the heal action ran"
	}
	return []Event{{Kind: EventHealed, Message: msg}}
}

// ExpireHeal fails a peer whose heal did not verify in time: its engine
// did not come back as a new instance by the deadline.
func ExpireHeal(prev Peer, now time.Time) (Peer, []Event, bool) {
	if prev.State != StateStale || prev.Heal.Phase != HealVerifying || !now.After(prev.Heal.Deadline) {
		return prev, nil, false
	}
	next := prev
	msg := fmt.Sprintf("heal did not verify: no new instance by the deadline after the heal action (still generation %d)", prev.Generation)
	next.Heal = Heal{Recent: prev.Heal.Recent}
	next.State, next.StateReason, next.UpdatedAt = StateFailed, msg, now
	return next, []Event{{Kind: EventHealFailed, Message: msg}}, true
}
