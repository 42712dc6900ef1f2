package router

import (
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
)

// A panic on the prefill leg's goroutine fails that leg as an unusable
// answer: nothing above that goroutine would catch it, and the process,
// with every request in it, would end. Here the router is a bare struct
// (no clock, no metrics) and the prefill has no endpoint, so the leg
// panics at its first step.
func TestPrefillLegPanicFailsTheLegNotTheProcess(t *testing.T) {
	d := &dispatch{rt: &Router{log: zerolog.Nop()}, rid: "r1"}
	pr := &pair{p: &peerRef{peer: &registry.Peer{PeerSpec: registry.PeerSpec{Name: "p0"}}}}
	res := d.prefillGuarded(newAttemptCtx(context.Background()), pr, []byte(`{}`))
	if res.fail == nil || res.fail.kind != failProtocol || res.fail.leg != legPrefill {
		t.Fatalf("result %+v, want a protocol failure of the prefill leg", res.fail)
	}
	if res.fail.err == nil || !strings.Contains(res.fail.err.Error(), "panic") {
		t.Fatalf("error %v, want the panic named", res.fail.err)
	}
}

// The dispatch waiting for that leg gets the panic back, on its own
// goroutine: the request ends as any panic of the router's does (counted
// internal_error, not retried on another pair, no breaker failure against
// the engines), once, although wait is called again (deferred).
func TestPrefillLegPanicIsRaisedOnTheDispatch(t *testing.T) {
	d := &dispatch{rt: &Router{log: zerolog.Nop()}, rid: "r1"}
	pr := &pair{p: &peerRef{peer: &registry.Peer{PeerSpec: registry.PeerSpec{Name: "p0"}}}}
	pl := &prefillLeg{ch: make(chan prefillResult, 1)}
	pl.ch <- d.prefillGuarded(newAttemptCtx(context.Background()), pr, []byte(`{}`))
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(p.(string), "prefill leg") {
				t.Errorf("wait recovered %v, want the prefill leg's panic", p)
			}
		}()
		pl.wait()
	}()
	if res := pl.wait(); res.fail == nil || res.fail.leg != legPrefill {
		t.Errorf("second wait: %+v, want the leg's failure without a second panic", res.fail)
	}
}
