//go:build linux

package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/sim"
)

// healHold is --heal-hold in the pair test: long enough for the load to
// send several streams through the healthy prefill to the victim.
const healHold = 4 * time.Second

// TestHealQuarantinesThePairFirst is issue 13's first step with real
// processes: two prefills, two decodes, one agent per engine. The victim
// decode's registration breaks for one prefill only (SGLang's broken entry
// is per prefill and decode agent). The registry quarantines that pair and
// holds the victim's heal plan while the other prefill keeps sending to
// it; then the victim drains (its streams finish), its agent restarts it
// once, and the new instance at generation + 1 serves both prefills
// again, the quarantine lifted. No client request fails.
func TestHealQuarantinesThePairFirst(t *testing.T) {
	healStores(t, testHealQuarantinesThePairFirst)
}

// fromPrefill is how many transfers the decode of st received from the
// prefill whose bootstrap port is port.
func fromPrefill(st sim.Stats, port int) int64 {
	var n int64
	for addr, c := range st.TransfersFrom {
		if strings.HasSuffix(addr, ":"+strconv.Itoa(port)) {
			n += c
		}
	}
	return n
}

func testHealQuarantinesThePairFirst(t *testing.T, dbURL string) {
	f := startHealFleetWith(t, dbURL, healOpts{verify: 20 * time.Second, restart: true, prefills: 2, hold: healHold})
	before := f.peer(t)
	broken, healthy := f.bootstrapPorts[0], f.bootstrapPorts[1]

	load := startHealLoad(6, f.base)
	defer load.close()
	steady := time.Now()
	load.waitCompleted(t, steady, 20)
	waitFor(t, "both prefills sending to the victim", 20*time.Second, func() bool {
		s, err := simStats(f.victim)
		return err == nil && fromPrefill(s, broken) > 0 && fromPrefill(s, healthy) > 0
	})
	faultAt := time.Now()
	setPairFault(t, f.victim, sim.FaultMissingMemKind, broken)
	load.extra(4, f.base)

	// While the plan holds, the healthy prefill keeps sending to the
	// victim. Both samples are taken while the plan is seen holding: the
	// first after the peer is read, the last before.
	holding := func() bool {
		p := f.peer(t)
		return p.State == "ready" && p.Heal != nil && p.Heal.Phase == "quarantined"
	}
	waitFor(t, "the victim's heal plan holding", 20*time.Second, holding)
	atHold := mustSimStats(t, f.victim)
	lastHolding := atHold
	var runningAtDrain int
	var drainSeen time.Time
	waitFor(t, "the victim draining", 30*time.Second, func() bool {
		s := mustSimStats(t, f.victim)
		if holding() {
			lastHolding = s
			return false
		}
		drainSeen, runningAtDrain = time.Now(), s.Running
		return true
	})
	waitFor(t, "the heal action runs", 30*time.Second, func() bool { return len(f.actionRuns(t)) > 0 })
	waitFor(t, "the victim ready at generation + 1", 30*time.Second, func() bool {
		p := f.peer(t)
		return p.State == "ready" && p.Generation == before.Generation+1
	})
	// The broken prefill sends to the healed victim again: its quarantine
	// is lifted.
	healedStats := mustSimStats(t, f.victim)
	waitFor(t, "the healed victim receiving KV from the once broken prefill", 30*time.Second, func() bool {
		s, err := simStats(f.victim)
		return err == nil && fromPrefill(s, broken) > fromPrefill(healedStats, broken)
	})
	f.waitHeartbeats(t, 10)
	load.close()
	end := time.Now()

	// 1. No client-visible failure.
	streams := load.snapshot()
	nFailed := 0
	for _, s := range streams {
		if s.err != nil {
			if nFailed++; nFailed <= 5 {
				t.Errorf("stream started at +%s failed: %v", s.start.Sub(faultAt).Round(time.Millisecond), s.err)
			}
		}
	}
	t.Logf("%d streamed chat completions from %s to %s, %d failed", len(streams), steady.Format("15:04:05.000"), end.Format("15:04:05.000"), nFailed)

	// 2. The timeline, in order.
	evs := f.events(t)
	quarantined, qi := firstEvent(evs, 0, "quarantined")
	started, si := firstEvent(evs, max(qi, 0), "heal_started")
	draining, di := firstEvent(evs, max(si, 0), "heal_draining")
	acting, ai := firstEvent(evs, max(di, 0), "heal_acting")
	rereg, ri := firstEvent(evs, max(ai, 0), "reregistered")
	healed, hi := firstEvent(evs, max(ri, 0), "healed")
	lifted, li := firstEvent(evs, max(hi, 0), "quarantine_lifted")
	if qi < 0 || si < 0 || di < 0 || ai < 0 || ri < 0 || hi < 0 || li < 0 {
		t.Fatalf("heal events out of order or missing: %+v", evs)
	}
	runs := f.actionRuns(t)
	actionAt := firstRunAt(runs)
	at := func(t time.Time) string { return since(quarantined.At, t) }
	logTimeline(t, fmt.Sprintf("heal timeline (store %q), from the victim's events; + is after the pair's quarantine", storeName(dbURL)), quarantined.At,
		timelineStep{"fault injected (pair)", faultAt, "(test clock)"},
		eventStep(quarantined), eventStep(started), eventStep(draining), eventStep(acting),
		timelineStep{"action ran", actionAt, "(script's clock)"},
		eventStep(rereg), eventStep(healed), eventStep(lifted))
	wantOneEach(t, evs, "quarantined", "heal_started", "heal_draining", "heal_acting", "reregistered", "healed", "quarantine_lifted")
	for _, k := range []string{"heal_failed", "stale"} {
		if n := countEvents(evs, k); n != 0 {
			t.Errorf("%d %s events; want none: the decode drains at the hold's end, not at the failure", n, k)
		}
	}
	if d := draining.At.Sub(started.At); d < healHold {
		t.Errorf("drained %s after the plan started; want the hold (%s) first", d, healHold)
	}

	// 3. The healthy prefill's streams reached the victim while the plan
	// held.
	t.Logf("victim's transfers from the healthy prefill: %d when the plan was first seen holding, %d when last seen holding; "+
		"from the broken one: %d, then %d from the restarted engine (its counters start afresh)", fromPrefill(atHold, healthy), fromPrefill(lastHolding, healthy),
		fromPrefill(atHold, broken), fromPrefill(mustSimStats(t, f.victim), broken))
	if fromPrefill(lastHolding, healthy) <= fromPrefill(atHold, healthy) {
		t.Errorf("the healthy prefill sent nothing to the victim while its plan held")
	}

	// 4. The action ran once; the victim is back at generation + 1 with
	// a new instance, and no quarantine is left.
	if len(runs) != 1 {
		t.Errorf("the heal action ran %d times: %q; want once", len(runs), runs)
	}
	after := f.peer(t)
	if after.State != "ready" || after.Generation != before.Generation+1 || after.InstanceID == before.InstanceID || after.Heal != nil {
		t.Errorf("victim after the heal: %s at generation %d, instance %s, plan %+v; want ready at generation %d with a new instance",
			after.State, after.Generation, after.InstanceID, after.Heal, before.Generation+1)
	}
	if !strings.HasPrefix(acting.Message, "drained") {
		t.Errorf("heal_acting: %q; want the victim drained before the action", acting.Message)
	}

	// 5. Streams in flight on the victim when it began draining finished.
	inFlight, onVictim := 0, 0
	for _, s := range streams {
		if s.onVictim() {
			onVictim++
			if s.firstByte.Before(draining.At) && s.end.After(draining.At) {
				inFlight++
				t.Logf("  in flight on the victim at heal_draining: %d tokens, first byte %s, [DONE] %s", s.tokens, at(s.firstByte), at(s.end))
			}
		}
	}
	t.Logf("%d streams served by the victim (by their pace), %d streaming when it began draining, all ended with [DONE]; "+
		"its engine had %d requests in flight when the test first saw it draining (at %s)", onVictim, inFlight, runningAtDrain, at(drainSeen))
	if onVictim == 0 {
		t.Errorf("no stream was served at the victim's pace: the pace check is broken")
	}
	if inFlight == 0 {
		t.Errorf("no stream was streaming from the victim when it began draining: nothing in flight was tested")
	}
}
