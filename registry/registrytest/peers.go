package registrytest

import (
	"fmt"

	"github.com/pdplane/pdplane/registry"
)

// Spec returns a valid registration of an SGLang peer with one rank of two
// VRAM regions, named name, for model "m". Tests adjust what they need.
func Spec(name string, role registry.Role) registry.PeerSpec {
	return registry.PeerSpec{
		Name: name, Role: role, Engine: registry.EngineSGLang,
		URL: "http://127.0.0.1:30000", Model: "m", InstanceID: "inst-" + name,
		Parallelism: registry.Parallelism{TPSize: 1},
		KV:          registry.KVGeometry{PageSize: 16, DType: "bfloat16", NumLayers: 2, NumKVHeads: 8, HeadDim: 128},
		Ranks: []registry.Rank{{
			Rank: 0, GPUID: 0, AgentName: name + "-agent-0", AgentMetadata: []byte("meta-" + name),
			KVDataPtrs: []uint64{0x7f0000000000, 0x7f0001000000},
			KVDataLens: []uint64{1 << 20, 1 << 20},
			KVItemLens: []uint64{4096, 4096},
			KVMemKinds: []registry.MemKind{registry.VRAM, registry.VRAM},
		}},
	}.WithDefaults()
}

// Fleet returns n prefill and n decode specs named p0.., d0.. .
func Fleet(n int) []registry.PeerSpec {
	specs := make([]registry.PeerSpec, 0, 2*n)
	for i := 0; i < n; i++ {
		specs = append(specs, Spec(fmt.Sprintf("p%d", i), registry.RolePrefill), Spec(fmt.Sprintf("d%d", i), registry.RoleDecode))
	}
	return specs
}

// PublishedSpec returns a valid registration of an SGLang peer as an agent
// makes it from what a stock engine publishes: model, role, parallelism,
// page size and dtype observed; KV shape, MLA and ranks unknown.
func PublishedSpec(name string, role registry.Role) registry.PeerSpec {
	s := Spec(name, role)
	s.KV = registry.KVGeometry{PageSize: s.KV.PageSize, DType: s.KV.DType}
	s.Ranks = nil
	s.Observed = []string{"role", "model", "parallelism.tp_size", "parallelism.dp_size", "parallelism.pp_size",
		"kv.page_size", "kv.dtype"}
	s.Unknown = registry.UnknownableFields()
	return s
}
