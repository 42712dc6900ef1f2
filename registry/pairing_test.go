package registry_test

import (
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
)

func TestCheckPair(t *testing.T) {
	t.Parallel()
	kinds := func(ks ...registry.MemKind) func(s *registry.PeerSpec) {
		return func(s *registry.PeerSpec) {
			s.Ranks[0].KVMemKinds = ks
			s.Ranks[0].KVDataPtrs = make([]uint64, len(ks))
			s.Ranks[0].KVDataLens = make([]uint64, len(ks))
			s.Ranks[0].KVItemLens = make([]uint64, len(ks))
			for i := range ks {
				s.Ranks[0].KVDataPtrs[i] = uint64(i+1) << 24
				s.Ranks[0].KVDataLens[i], s.Ranks[0].KVItemLens[i] = 1<<20, 4096
			}
		}
	}
	attnTP := func(n int) func(s *registry.PeerSpec) {
		return func(s *registry.PeerSpec) { s.Parallelism.TPSize, s.Parallelism.AttnTPSize = n, n }
	}
	for _, tc := range []struct {
		name       string
		prefill    []func(*registry.PeerSpec)
		decode     []func(*registry.PeerSpec)
		compatible bool
		path       registry.Path
		reason     string
	}{
		{name: "equal tp, homogeneous VRAM", compatible: true, path: registry.PathEqualTP},
		{name: "mla", prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.KV.IsMLA = true }},
			decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.KV.IsMLA = true }, attnTP(2)}, compatible: true, path: registry.PathMLA},
		{name: "homogeneous DRAM destination", decode: []func(*registry.PeerSpec){kinds(registry.DRAM, registry.DRAM)}, compatible: true, path: registry.PathEqualTP},
		{name: "mixed destination, equal counts", decode: []func(*registry.PeerSpec){kinds(registry.VRAM, registry.DRAM)}, compatible: true, path: registry.PathMixedSegments},
		{name: "mixed destination, more regions than source",
			decode: []func(*registry.PeerSpec){kinds(registry.VRAM, registry.DRAM, registry.DRAM)}, reason: "mixed memory kinds need equal region counts"},
		{name: "fewer destination regions", decode: []func(*registry.PeerSpec){kinds(registry.VRAM)}, reason: "fewer KV regions (1) than the prefill sends (2)"},
		{name: "destination kinds missing (the seed state)",
			decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Ranks[0].KVMemKinds = nil }}, reason: "destination memory kind unresolvable"},
		{name: "hetero tp into VRAM", decode: []func(*registry.PeerSpec){attnTP(2)}, compatible: true, path: registry.PathHeteroTP},
		{name: "hetero tp into DRAM", decode: []func(*registry.PeerSpec){attnTP(2), kinds(registry.DRAM, registry.DRAM)}, reason: "supports only VRAM destinations"},
		{name: "other model", decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Model = "other" }}, reason: "models differ"},
		{name: "page size", decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.KV.PageSize = 32 }}, reason: "page sizes differ"},
		{name: "dtype", decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.KV.DType = "fp8_e4m3" }}, reason: "kv dtypes differ"},
		{name: "pp 2 into pp 1", prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Parallelism.PPSize = 2 }}, compatible: true, path: registry.PathEqualTP},
		{name: "pp 2 into pp 4", prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Parallelism.PPSize = 2 }},
			decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Parallelism.PPSize = 4 }}, reason: "pipeline parallel sizes differ"},
		{name: "transfer group on one side", decode: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.TransferGroup = "rack1" }}, reason: "transfer groups differ"},
		{name: "same transfer group",
			prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.TransferGroup = "rack1" }},
			decode:  []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.TransferGroup = "rack1" }}, compatible: true, path: registry.PathEqualTP},
		{name: "vllm prefill, sglang decode", prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Engine = registry.EngineVLLM }}, reason: "engine protocols differ"},
		{name: "sim speaks sglang", prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Engine = registry.EngineSim }}, compatible: true, path: registry.PathEqualTP},
		{name: "decode cannot prefill", prefill: []func(*registry.PeerSpec){func(s *registry.PeerSpec) { s.Role = registry.RoleDecode }}, reason: "cannot prefill"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := registrytest.Spec("p", registry.RolePrefill), registrytest.Spec("d", registry.RoleDecode)
			for _, f := range tc.prefill {
				f(&p)
			}
			for _, f := range tc.decode {
				f(&d)
			}
			v := registry.CheckPair(&p, &d)
			if v.Compatible != tc.compatible || v.Path != tc.path || !strings.Contains(v.Reason, tc.reason) {
				t.Fatalf("verdict %+v, want compatible=%v path=%q reason containing %q", v, tc.compatible, tc.path, tc.reason)
			}
			if !v.Compatible && v.Reason == "" {
				t.Fatal("a refusal must say why")
			}
		})
	}
}

// TestCheckPairWithUnknowns pins that pairing checks what both sides know,
// refuses on a known mismatch, and names every rule it could not check.
func TestCheckPairWithUnknowns(t *testing.T) {
	t.Parallel()
	pub := registrytest.PublishedSpec
	full := registrytest.Spec
	// mlaKnown is what a published peer leaves unknown once its MLA flag is
	// declared: the KV shape and its ranks.
	mlaKnown := []string{"kv.num_layers", "kv.num_kv_heads", "kv.head_dim", "ranks"}
	for _, tc := range []struct {
		name       string
		prefill    registry.PeerSpec
		decode     registry.PeerSpec
		edit       func(p, d *registry.PeerSpec)
		compatible bool
		path       registry.Path
		unverified []string
		reason     string
	}{
		{name: "both published", prefill: pub("p", registry.RolePrefill), decode: pub("d", registry.RoleDecode), compatible: true,
			unverified: []string{"kv.is_mla", "ranks[*].kv_data_ptrs", "path", "ranks[*].kv_mem_kinds"}},
		{name: "both declared is verified", prefill: full("p", registry.RolePrefill), decode: full("d", registry.RoleDecode),
			compatible: true, path: registry.PathEqualTP},
		{name: "published model mismatch refused", prefill: pub("p", registry.RolePrefill), decode: pub("d", registry.RoleDecode),
			edit: func(_, d *registry.PeerSpec) { d.Model = "other" }, reason: "models differ"},
		{name: "published page size mismatch refused", prefill: pub("p", registry.RolePrefill), decode: pub("d", registry.RoleDecode),
			edit: func(_, d *registry.PeerSpec) { d.KV.PageSize = 64 }, reason: "page sizes differ"},
		{name: "published dtype mismatch refused", prefill: pub("p", registry.RolePrefill), decode: pub("d", registry.RoleDecode),
			edit: func(_, d *registry.PeerSpec) { d.KV.DType = "fp8_e5m2" }, reason: "kv dtypes differ"},
		{name: "known MLA on one side fixes the path", prefill: pub("p", registry.RolePrefill), decode: pub("d", registry.RoleDecode),
			edit:       func(p, _ *registry.PeerSpec) { p.Unknown = mlaKnown; p.KV.IsMLA = true },
			compatible: true, path: registry.PathMLA, unverified: []string{"kv.is_mla", "ranks[*].kv_data_ptrs", "ranks[*].kv_mem_kinds"}},
		{name: "MLA known on both sides and different refused", prefill: pub("p", registry.RolePrefill), decode: pub("d", registry.RoleDecode),
			edit: func(p, d *registry.PeerSpec) {
				p.Unknown, d.Unknown = mlaKnown, mlaKnown
				p.KV.IsMLA = true
			}, reason: "one side uses MLA"},
		{name: "declared decode kinds checked against a published prefill", prefill: pub("p", registry.RolePrefill), decode: full("d", registry.RoleDecode),
			edit:       func(p, _ *registry.PeerSpec) { p.Unknown = mlaKnown },
			compatible: true, path: registry.PathEqualTP, unverified: []string{"ranks[*].kv_data_ptrs"}},
		{name: "declared DRAM decode refused on the hetero TP path even beside a published prefill",
			prefill: pub("p", registry.RolePrefill), decode: full("d", registry.RoleDecode),
			edit: func(p, d *registry.PeerSpec) {
				p.Unknown = mlaKnown
				d.Parallelism.TPSize, d.Parallelism.AttnTPSize = 2, 2
				d.Ranks[0].KVMemKinds = []registry.MemKind{registry.DRAM, registry.DRAM}
			}, reason: "supports only VRAM destinations"},
		{name: "mixed decode kinds need the prefill's", prefill: pub("p", registry.RolePrefill), decode: full("d", registry.RoleDecode),
			edit: func(p, d *registry.PeerSpec) {
				p.Unknown = mlaKnown
				d.Ranks[0].KVMemKinds = []registry.MemKind{registry.VRAM, registry.DRAM}
			}, compatible: true, path: registry.PathMixedSegments, unverified: []string{"ranks[*].kv_data_ptrs", "ranks[*].kv_mem_kinds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := tc.prefill, tc.decode
			if tc.edit != nil {
				tc.edit(&p, &d)
			}
			for _, s := range []*registry.PeerSpec{&p, &d} {
				if err := s.Validate(); err != nil {
					t.Fatalf("test spec %s invalid: %v", s.Name, err)
				}
			}
			v := registry.CheckPair(&p, &d)
			if v.Compatible != tc.compatible || v.Path != tc.path || !strings.Contains(v.Reason, tc.reason) ||
				strings.Join(v.Unverified, ",") != strings.Join(tc.unverified, ",") {
				t.Fatalf("verdict %+v, want compatible=%v path=%q unverified=%q reason containing %q",
					v, tc.compatible, tc.path, tc.unverified, tc.reason)
			}
			if v.Compatible && v.Verified() != (len(tc.unverified) == 0) {
				t.Fatalf("verified = %v with unverified %q", v.Verified(), v.Unverified)
			}
		})
	}
}

func TestSegments(t *testing.T) {
	t.Parallel()
	V, D := registry.VRAM, registry.DRAM
	segs, err := registry.Segments([]registry.MemKind{V, V, V, V}, []registry.MemKind{V, V, D, D})
	if err != nil || len(segs) != 2 || segs[0] != (registry.Segment{SrcKind: V, DstKind: V, Start: 0, Count: 2}) ||
		segs[1] != (registry.Segment{SrcKind: V, DstKind: D, Start: 2, Count: 2}) {
		t.Fatalf("segments = %+v, %v", segs, err)
	}
	if _, err := registry.Segments([]registry.MemKind{V}, []registry.MemKind{V, D}); err == nil {
		t.Fatal("unequal counts must fail")
	}
	if k, ok := registry.HomogeneousKind([]registry.MemKind{D, D}); !ok || k != D {
		t.Fatal("homogeneous DRAM not found")
	}
	if _, ok := registry.HomogeneousKind(nil); ok {
		t.Fatal("no regions has no homogeneous kind")
	}
}

func TestMemKindNames(t *testing.T) {
	t.Parallel()
	for i, name := range []string{"DRAM", "VRAM", "BLOCK", "OBJECT", "FILE"} {
		k, err := registry.ParseMemKind(strings.ToLower(name))
		if err != nil || int(k) != i || k.String() != name {
			t.Errorf("%s: %v %v", name, k, err)
		}
	}
	if _, err := registry.ParseMemKind("HBM"); err == nil {
		t.Error("HBM parsed")
	}
}

// TestGeometryDiffWithUnknowns pins that a quarantine record shows a field
// one side does not know as unknown, never as a zero that reads as a value.
func TestGeometryDiffWithUnknowns(t *testing.T) {
	t.Parallel()
	p, d := registrytest.PublishedSpec("p", registry.RolePrefill), registrytest.Spec("d", registry.RoleDecode)
	got := registry.GeometryDiff(&p, &d)
	for _, want := range []string{"num_layers: prefill unknown, decode 2", "head_dim: prefill unknown, decode 128", "ranks: prefill unknown, decode 1"} {
		if !strings.Contains(got, want) {
			t.Errorf("diff %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "prefill 0") {
		t.Errorf("diff %q shows an unknown as 0", got)
	}
	d = registrytest.PublishedSpec("d", registry.RoleDecode)
	if got := registry.GeometryDiff(&p, &d); !strings.Contains(got, "no known geometry difference") {
		t.Errorf("two published peers: %q", got)
	}
}
