package memstore_test

import (
	"context"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// BenchmarkHeartbeat heartbeats a peer whose rank carries 4 MiB of NIXL
// agent metadata, the size real agents publish: the heartbeat path must not
// copy it.
func BenchmarkHeartbeat(b *testing.B) {
	s := memstore.New(memstore.Config{})
	spec := registrytest.Spec("d0", registry.RoleDecode)
	spec.Ranks[0].AgentMetadata = make([]byte, 4<<20)
	res, err := s.Register(context.Background(), spec, registry.Claim{Admin: true})
	if err != nil {
		b.Fatal(err)
	}
	hb := registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: spec.InstanceID}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Heartbeat(context.Background(), hb); err != nil {
			b.Fatal(err)
		}
	}
}
