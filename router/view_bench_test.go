package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// BenchmarkViewBuild measures what a router pays to follow one change at
// fleet sizes: one decode marked stale, then ready again, each registry
// snapshot patched from the one before it (as a Mirror builds them) and
// the router's view built from it.
func BenchmarkViewBuild(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			records := fleet(n)
			rt, _ := newPickRouter(b, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyRoundRobin}, records)
			s := replica.NewSnapshot(1, records, nil, time.Now())
			rt.buildView(s)
			states := [2]registry.State{registry.StateStale, registry.StateReady}
			k := 0
			for b.Loop() {
				next := *s.Peers()[1] // a decode
				next.State = states[k%2]
				k++
				s = s.Next(uint64(k+1), map[string]*registry.Peer{next.ID: &next}, nil, nil, time.Now())
				rt.buildView(s)
			}
		})
	}
}
