package routertest

import (
	"time"

	"github.com/pdplane/pdplane/registry"
)

// Spec returns a registration of one engine with a KV geometry that pairs
// with every other Spec of the same model and engine protocol: one rank, one
// VRAM region, page size 16, bf16.
func Spec(name string, role registry.Role, engine registry.Engine, url, model string) registry.PeerSpec {
	s := registry.PeerSpec{
		Name:          name,
		Role:          role,
		Engine:        engine,
		URL:           url,
		BootstrapHost: "127.0.0.1",
		Model:         model,
		InstanceID:    name + "-instance",
		Parallelism:   registry.Parallelism{TPSize: 1, AttnTPSize: 1, DPSize: 1, PPSize: 1, DCPSize: 1},
		KV:            registry.KVGeometry{PageSize: 16, DType: "bf16", NumLayers: 2, NumKVHeads: 2, HeadDim: 64},
		Ranks: []registry.Rank{{
			Rank:       0,
			AgentName:  name + "-agent-0",
			KVDataPtrs: []uint64{0x10000},
			KVDataLens: []uint64{1 << 20},
			KVItemLens: []uint64{4096},
			KVMemKinds: []registry.MemKind{registry.VRAM},
		}},
	}
	return s.WithDefaults()
}

// ReadyPeer returns a ready peer of the spec at the generation, with ID
// "id-" + name.
func ReadyPeer(spec registry.PeerSpec, generation int64) registry.Peer {
	t := time.Unix(1_700_000_000, 0).UTC()
	return registry.Peer{
		PeerSpec:   spec,
		ID:         "id-" + spec.Name,
		State:      registry.StateReady,
		Generation: generation,
		CreatedAt:  t,
		UpdatedAt:  t,
	}
}
