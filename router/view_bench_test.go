package router

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
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
			peers := make([]*registry.Peer, n)
			for i := range records {
				peers[i] = &records[i]
			}
			slices.SortFunc(peers, func(a, b *registry.Peer) int { return strings.Compare(a.Name, b.Name) })
			s := registry.NewSnapshot(1, records, nil, time.Now())
			rt.buildView(s)
			states := [2]registry.State{registry.StateStale, registry.StateReady}
			k := 0
			for b.Loop() {
				next := *peers[1] // a decode
				next.State = states[k%2]
				k++
				peers = slices.Clone(peers)
				peers[1] = &next
				s = s.Next(uint64(k+1), peers, map[string]*registry.Peer{next.ID: &next}, nil, nil, time.Now())
				rt.buildView(s)
			}
		})
	}
}
