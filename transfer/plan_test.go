package transfer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

const (
	D = registry.DRAM
	V = registry.VRAM
)

// geom builds a rank whose region i starts at base + i*0x10000, holds slots
// items of item bytes, and has kinds[i].
func geom(name string, base uint64, item uint64, slots int, kinds ...registry.MemKind) transfer.RankGeometry {
	g := transfer.RankGeometry{AgentName: name, GPUID: 3}
	for i, k := range kinds {
		g.KVDataPtrs = append(g.KVDataPtrs, base+uint64(i)*0x10000)
		g.KVDataLens = append(g.KVDataLens, item*uint64(slots))
		g.KVItemLens = append(g.KVItemLens, item)
		g.KVMemKinds = append(g.KVMemKinds, k)
	}
	return g
}

func src(mla, hybrid bool, tp int, kinds ...registry.MemKind) transfer.Source {
	return transfer.Source{Geometry: geom("prefill", 0x100000, 256, 8, kinds...), MLA: mla, HybridMLA: hybrid, AttnTPSize: tp}
}

func dest(tp int, kind *registry.MemKind, segs []registry.Segment, kinds ...registry.MemKind) *transfer.Destination {
	d := &transfer.Destination{Geometry: geom("decode", 0x900000, 256, 8, kinds...), AttnTPSize: tp, Segments: segs}
	if kind != nil {
		d.Kind, d.HasKind = *kind, true
	}
	return d
}

func kindPtr(k registry.MemKind) *registry.MemKind { return &k }

// TestChoosePathInvariant pins the exact state in which the missing-kind
// error is raised (a kind-needing path, no segments, no homogeneous kind)
// and the states in which it must not be.
func TestChoosePathInvariant(t *testing.T) {
	t.Parallel()
	segs := []registry.Segment{{SrcKind: V, DstKind: V, Start: 0, Count: 2}, {SrcKind: V, DstKind: D, Start: 2, Count: 2}}
	cases := []struct {
		name     string
		src      transfer.Source
		dst      *transfer.Destination
		wantPath transfer.Path
		missing  bool  // *MissingMemKindError expected
		wantErr  error // another error class expected
	}{
		{"mla with a kind", src(true, false, 2, V, V), dest(2, kindPtr(V), nil, V, V), transfer.PathMLA, false, nil},
		{"hybrid mla with a kind", src(false, true, 2, V, V), dest(4, kindPtr(D), nil, D, D), transfer.PathMLA, false, nil},
		{"equal tp with a kind", src(false, false, 2, V, V), dest(2, kindPtr(D), nil, D, D), transfer.PathEqualTP, false, nil},
		{"mla, no kind, no segments", src(true, false, 2, V, V), dest(2, nil, nil, V, V), transfer.PathMLA, true, nil},
		{"mla with unequal tp, no kind, no segments", src(true, false, 2, V, V), dest(8, nil, nil, V, V), transfer.PathMLA, true, nil},
		{"hybrid mla, no kind, no segments", src(false, true, 2, V, V), dest(2, nil, nil, V, V), transfer.PathMLA, true, nil},
		{"equal tp, no kind, no segments", src(false, false, 4, V, V), dest(4, nil, nil, V, V), transfer.PathEqualTP, true, nil},
		{"equal tp, segments, no kind", src(false, false, 2, V, V, V, V), dest(2, nil, segs, V, V, D, D), transfer.PathMixedSegments, false, nil},
		{"mla, segments, no kind", src(true, false, 2, V, V, V, V), dest(2, nil, segs, V, V, D, D), transfer.PathMixedSegments, false, nil},
		{"segments win over a kind", src(false, false, 2, V, V, V, V), dest(2, kindPtr(V), segs, V, V, D, D), transfer.PathMixedSegments, false, nil},
		{"empty segments", src(false, false, 2, V, V), dest(2, nil, []registry.Segment{}, V, V), transfer.PathMixedSegments, false, transfer.ErrInvalidDescs},
		{"hetero tp, no kind: not the missing-kind error", src(false, false, 2, V, V), dest(4, nil, nil, V, V), transfer.PathHeteroTP, false, transfer.ErrUnsupportedKind},
		{"hetero tp to vram", src(false, false, 2, V, V), dest(4, kindPtr(V), nil, V, V), transfer.PathHeteroTP, false, nil},
		{"hetero tp to dram", src(false, false, 2, V, V), dest(1, kindPtr(D), nil, D, D), transfer.PathHeteroTP, false, transfer.ErrUnsupportedKind},
		{"no destination at all", src(true, false, 2, V, V), nil, "", true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path, err := transfer.ChoosePath(tc.src, tc.dst)
			if path != tc.wantPath {
				t.Errorf("path %q, want %q", path, tc.wantPath)
			}
			var mk *transfer.MissingMemKindError
			switch {
			case tc.missing:
				if !errors.As(err, &mk) {
					t.Fatalf("got %v, want *MissingMemKindError", err)
				}
				if err.Error() != "Missing NIXL destination KV memory kind" {
					t.Fatalf("message %q", err.Error())
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) || errors.As(err, &mk) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
			default:
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
			}
			// BuildPlan raises exactly what ChoosePath does.
			_, perr := transfer.BuildPlan(tc.src, tc.dst, transfer.Pages{SrcPages: []int{0}, DstPages: []int{1}}, "n")
			if tc.missing != errors.As(perr, &mk) {
				t.Fatalf("BuildPlan: %v", perr)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		src       transfer.Source
		dst       transfer.RankGeometry
		dstTP     int
		wantKind  *registry.MemKind
		wantSegs  []registry.Segment
		wantField string // *GeometryError naming this field
		wantErr   error
	}{
		{name: "homogeneous dram", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, D, D), dstTP: 2, wantKind: kindPtr(D)},
		{name: "homogeneous vram, mla, unequal tp", src: src(true, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, V), dstTP: 8, wantKind: kindPtr(V)},
		{name: "decode has extra regions", src: src(true, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, V, V), dstTP: 2, wantKind: kindPtr(V)},
		{
			name: "mixed destination", src: src(false, false, 2, V, V, V, V), dst: geom("d", 0x900000, 256, 8, V, D, D, V), dstTP: 2,
			wantSegs: []registry.Segment{{SrcKind: V, DstKind: V, Start: 0, Count: 1}, {SrcKind: V, DstKind: D, Start: 1, Count: 2}, {SrcKind: V, DstKind: V, Start: 3, Count: 1}},
		},
		{
			name: "mixed source", src: src(false, false, 2, V, D), dst: geom("d", 0x900000, 256, 8, V, V), dstTP: 2,
			wantSegs: []registry.Segment{{SrcKind: V, DstKind: V, Start: 0, Count: 1}, {SrcKind: D, DstKind: V, Start: 1, Count: 1}},
		},
		{name: "mixed kinds with unequal counts", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, D, D), dstTP: 2, wantField: "kv_mem_kinds"},
		{name: "fewer destination regions", src: src(false, false, 2, V, V, V, V), dst: geom("d", 0x900000, 256, 8, V, V), dstTP: 2, wantField: "kv_data_ptrs"},
		{name: "hetero to dram", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, D, D), dstTP: 4, wantErr: transfer.ErrUnsupportedKind},
		{name: "hetero to mixed", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, D), dstTP: 4, wantField: "kv_mem_kinds"},
		{name: "hetero to vram", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, V), dstTP: 4, wantKind: kindPtr(V)},
		{name: "kinds missing", src: src(false, false, 2, V, V), dst: func() transfer.RankGeometry { g := geom("d", 0x900000, 256, 8, V, V); g.KVMemKinds = nil; return g }(), dstTP: 2, wantField: "kv_mem_kinds"},
		{name: "unknown kind", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, registry.MemKind(9)), dstTP: 2, wantField: "kv_mem_kinds"},
		{name: "zero item length", src: src(false, false, 2, V, V), dst: func() transfer.RankGeometry { g := geom("d", 0x900000, 256, 8, V, V); g.KVItemLens[1] = 0; return g }(), dstTP: 2, wantField: "kv_item_lens"},
		{name: "no tp size", src: src(false, false, 2, V, V), dst: geom("d", 0x900000, 256, 8, V, V), dstTP: 0, wantField: "attn_tp_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := transfer.Resolve(tc.src, tc.dst, tc.dstTP, 0)
			var ge *transfer.GeometryError // per subtest: they run in parallel
			switch {
			case tc.wantField != "":
				if !errors.As(err, &ge) || ge.Field != tc.wantField {
					t.Fatalf("got %v, want a geometry error on %s", err, tc.wantField)
				}
				return
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatalf("resolve: %v", err)
			}
			if tc.wantKind != nil && (!d.HasKind || d.Kind != *tc.wantKind || d.Segments != nil) {
				t.Fatalf("kind %v/%v segments %v, want kind %v", d.Kind, d.HasKind, d.Segments, *tc.wantKind)
			}
			if tc.wantSegs != nil && (d.HasKind || !reflect.DeepEqual(d.Segments, tc.wantSegs)) {
				t.Fatalf("segments %+v (kind %v), want %+v", d.Segments, d.HasKind, tc.wantSegs)
			}
			if _, err := transfer.ChoosePath(tc.src, d); err != nil {
				t.Fatalf("a resolved destination fails its path: %v", err)
			}
		})
	}
}

// TestResolvedNeverMissing: whatever Resolve accepts never reaches the
// missing-kind state.
func TestResolvedNeverMissing(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []registry.MemKind{D, V}
	pick := func(n int) []registry.MemKind {
		out := make([]registry.MemKind, n)
		for i := range out {
			out[i] = kinds[rng.IntN(2)]
		}
		return out
	}
	accepted := 0
	for range 2000 {
		n := 2 * (1 + rng.IntN(3))
		s := transfer.Source{Geometry: geom("p", 0x100000, 512, 4, pick(n)...), MLA: rng.IntN(3) == 0, HybridMLA: rng.IntN(5) == 0, AttnTPSize: 1 << rng.IntN(3), PageSize: 2, TotalKVHeads: 8}
		g := geom("d", 0x900000, 512, 4, pick(n+2*rng.IntN(2))...)
		d, err := transfer.Resolve(s, g, 1<<rng.IntN(3), rng.IntN(4))
		if err != nil {
			continue
		}
		accepted++
		var mk *transfer.MissingMemKindError
		if _, err := transfer.ChoosePath(s, d); errors.As(err, &mk) {
			t.Fatalf("resolved destination %+v reaches the missing-kind state", d)
		}
	}
	if accepted == 0 {
		t.Fatal("no geometry accepted")
	}
}

// plan resolves dst for s (the decode's attention TP size dstTP, rank
// dstRank) and builds the plan that moves pages to it, failing the test on
// either error.
func plan(t *testing.T, s transfer.Source, dst transfer.RankGeometry, dstTP, dstRank int, pages transfer.Pages, notif string) *transfer.Plan {
	t.Helper()
	d, err := transfer.Resolve(s, dst, dstTP, dstRank)
	if err != nil {
		t.Fatal(err)
	}
	p, err := transfer.BuildPlan(s, d, pages, notif)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuildPlanEqualTPMergesContiguousPages(t *testing.T) {
	t.Parallel()
	s := src(false, false, 2, D, D, D, D) // K0 K1 V0 V1, 8 slots of 256 bytes
	p := plan(t, s, geom("decode", 0x900000, 256, 8, D, D, D, D), 2, 0, transfer.Pages{SrcPages: []int{1, 2, 3, 6}, DstPages: []int{4, 5, 6, 0}}, "room_kv_0_1_0")
	if p.Path != transfer.PathEqualTP || len(p.Steps) != 1 {
		t.Fatalf("path %s, %d steps", p.Path, len(p.Steps))
	}
	st := p.Steps[0]
	if st.Notif != "room_kv_0_1_0" || st.Local.Kind != D || st.Dst.Kind != D {
		t.Fatalf("step %+v", st)
	}
	var wantL, wantD []transfer.Desc
	for r := range 4 {
		sb, db := uint64(0x100000+r*0x10000), uint64(0x900000+r*0x10000)
		wantL = append(wantL, transfer.Desc{Addr: sb + 256, Len: 768}, transfer.Desc{Addr: sb + 6*256, Len: 256})
		wantD = append(wantD, transfer.Desc{Addr: db + 4*256, Len: 768}, transfer.Desc{Addr: db, Len: 256})
	}
	if !reflect.DeepEqual(st.Local.Descs, wantL) || !reflect.DeepEqual(st.Dst.Descs, wantD) {
		t.Fatalf("local %+v\nwant %+v\ndst %+v\nwant %+v", st.Local.Descs, wantL, st.Dst.Descs, wantD)
	}
	if p.Bytes() != 4*1024 {
		t.Fatalf("plan moves %d bytes", p.Bytes())
	}
	if want := []int{1, 2, 3, 6, 9, 10, 11, 14, 17, 18, 19, 22, 25, 26, 27, 30}; !reflect.DeepEqual(st.LocalIdx, want) {
		t.Fatalf("local indices %v, want %v", st.LocalIdx, want)
	}
}

func TestBuildPlanMHAWithExtraDecodeLayers(t *testing.T) {
	t.Parallel()
	s := src(false, false, 1, D, D) // K0 V0
	p := plan(t, s, geom("decode", 0x900000, 256, 8, D, D, D, D), 1, 0, transfer.Pages{SrcPages: []int{0}, DstPages: []int{2}}, "n")
	// V0 of the source goes to the first V region of the decode (index 2).
	got := p.Steps[0].Dst.Descs
	if len(got) != 2 || got[0].Addr != 0x900000+512 || got[1].Addr != 0x900000+2*0x10000+512 {
		t.Fatalf("dst %+v", got)
	}
}

func TestBuildPlanMLAUsesDecodeStride(t *testing.T) {
	t.Parallel()
	s := src(true, false, 1, V, V)
	dg := geom("decode", 0x900000, 512, 8, V, V) // decode slots are wider
	p := plan(t, s, dg, 4, 0, transfer.Pages{SrcPages: []int{0, 1}, DstPages: []int{3, 4}}, "n")
	st := p.Steps[0]
	if p.Path != transfer.PathMLA || st.Local.Kind != V || st.Dst.Kind != V {
		t.Fatalf("path %s kinds %s/%s", p.Path, st.Local.Kind, st.Dst.Kind)
	}
	// No merging across a stride that differs from the length.
	want := []transfer.Desc{{Addr: 0x900000 + 3*512, Len: 256, DevID: 3}, {Addr: 0x900000 + 4*512, Len: 256, DevID: 3}, {Addr: 0x910000 + 3*512, Len: 256, DevID: 3}, {Addr: 0x910000 + 4*512, Len: 256, DevID: 3}}
	if !reflect.DeepEqual(st.Dst.Descs, want) {
		t.Fatalf("dst %+v, want %+v", st.Dst.Descs, want)
	}
}

func TestBuildPlanMixedSegments(t *testing.T) {
	t.Parallel()
	s := src(false, false, 2, V, V, V, V)
	p := plan(t, s, geom("decode", 0x900000, 256, 8, V, D, V, D), 2, 0, transfer.Pages{SrcPages: []int{5}, DstPages: []int{7}}, "42_kv_0_1_0")
	if p.Path != transfer.PathMixedSegments || len(p.Steps) != 4 {
		t.Fatalf("path %s with %d steps", p.Path, len(p.Steps))
	}
	for i, st := range p.Steps {
		if want := fmt.Sprintf("42_kv_0_1_0_part_%d_4", i); st.Notif != want {
			t.Errorf("step %d notif %q, want %q", i, st.Notif, want)
		}
		wantDst := V
		if i%2 == 1 {
			wantDst = D
		}
		if st.List != i || st.Local.Kind != V || st.Dst.Kind != wantDst {
			t.Errorf("step %d: list %d kinds %s->%s", i, st.List, st.Local.Kind, st.Dst.Kind)
		}
		if len(st.Dst.Descs) != 1 || st.Dst.Descs[0].Addr != 0x900000+uint64(i)*0x10000+7*256 {
			t.Errorf("step %d dst %+v", i, st.Dst.Descs)
		}
		wantDev := uint64(3)
		if wantDst == D {
			wantDev = 0
		}
		if st.Dst.Descs[0].DevID != wantDev {
			t.Errorf("step %d dst device %d, want %d", i, st.Dst.Descs[0].DevID, wantDev)
		}
	}
}

func TestBuildPlanHeteroTP(t *testing.T) {
	t.Parallel()
	// 4 KV heads of 8 bytes, 2 tokens per page.
	const headBytes, pageSize, heads = 8, 2, 4
	cases := []struct {
		name               string
		srcTP, srcRank     int
		dstTP, dstRank     int
		srcOff, dstOff     uint64
		send               uint64
		srcItem, dstItem   uint64
		srcSlots, dstSlots int
	}{
		// One prefill rank feeds two decode ranks: rank 1 takes heads 2-3.
		{"prefill tp 1 to decode tp 2", 1, 0, 2, 1, 2 * headBytes, 0, 2 * headBytes, pageSize * heads * headBytes, pageSize * 2 * headBytes, 4, 4},
		// Two prefill ranks feed one decode rank: rank 1 fills heads 2-3.
		{"prefill tp 2 to decode tp 1", 2, 1, 1, 0, 0, 2 * headBytes, 2 * headBytes, pageSize * 2 * headBytes, pageSize * heads * headBytes, 4, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := transfer.Source{Geometry: geom("p", 0x100000, tc.srcItem, tc.srcSlots, V, V), AttnTPSize: tc.srcTP, AttnTPRank: tc.srcRank, PageSize: pageSize, TotalKVHeads: heads}
			p := plan(t, s, geom("d", 0x900000, tc.dstItem, tc.dstSlots, V, V), tc.dstTP, tc.dstRank, transfer.Pages{SrcPages: []int{1}, DstPages: []int{2}}, "n")
			st := p.Steps[0]
			if p.Path != transfer.PathHeteroTP || len(st.Local.Descs) != 2*pageSize {
				t.Fatalf("path %s, %d spans", p.Path, len(st.Local.Descs))
			}
			srcTok, dstTok := tc.srcItem/pageSize, tc.dstItem/pageSize
			for r := range 2 {
				for tok := range pageSize {
					i := r*pageSize + tok
					wl := transfer.Desc{Addr: 0x100000 + uint64(r)*0x10000 + 1*tc.srcItem + uint64(tok)*srcTok + tc.srcOff, Len: tc.send, DevID: 3}
					wd := transfer.Desc{Addr: 0x900000 + uint64(r)*0x10000 + 2*tc.dstItem + uint64(tok)*dstTok + tc.dstOff, Len: tc.send, DevID: 3}
					if st.Local.Descs[i] != wl || st.Dst.Descs[i] != wd {
						t.Fatalf("span %d: %+v -> %+v, want %+v -> %+v", i, st.Local.Descs[i], st.Dst.Descs[i], wl, wd)
					}
				}
			}
		})
	}
}

func TestBuildPlanPages(t *testing.T) {
	t.Parallel()
	s := src(false, false, 2, D, D)
	d, err := transfer.Resolve(s, geom("decode", 0x900000, 256, 8, D, D), 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := transfer.BuildPlan(s, d, transfer.Pages{SrcPages: []int{8}, DstPages: []int{0}}, "n"); !errors.Is(err, transfer.ErrOutOfRange) {
		t.Fatalf("source page past the region: %v", err)
	}
	if _, err := transfer.BuildPlan(s, d, transfer.Pages{SrcPages: []int{0}, DstPages: []int{-1}}, "n"); !errors.Is(err, transfer.ErrOutOfRange) {
		t.Fatalf("negative destination page: %v", err)
	}
	p, err := transfer.BuildPlan(s, d, transfer.Pages{SrcPages: []int{0, 1, 2}, DstPages: []int{5}}, "n")
	if err != nil || len(p.Steps[0].LocalIdx) != 2 {
		t.Fatalf("extra source pages are dropped: %v %+v", err, p)
	}
	p, err = transfer.BuildPlan(s, d, transfer.Pages{}, "n")
	if err != nil || len(p.Steps) != 0 {
		t.Fatalf("no pages: %v %+v", err, p)
	}
}

// TestLayoutMatchesPlan: on every path, the step's indices into the
// prepared lists select exactly the step's flat lists.
func TestLayoutMatchesPlan(t *testing.T) {
	t.Parallel()
	hs := transfer.Source{Geometry: geom("p", 0x100000, 64, 4, V, V), AttnTPSize: 1, PageSize: 2, TotalKVHeads: 4}
	cases := []struct {
		name string
		src  transfer.Source
		dst  transfer.RankGeometry
		tp   int
	}{
		{"mla", src(true, false, 2, V, V), geom("d", 0x900000, 512, 8, V, V, V), 2},
		{"equal tp", src(false, false, 2, D, D, D, D), geom("d", 0x900000, 256, 8, D, D, D, D), 2},
		{"mixed", src(false, false, 2, V, V, D, D), geom("d", 0x900000, 256, 8, D, V, D, V), 2},
		{"hetero", hs, geom("d", 0x900000, 32, 4, V, V), 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := transfer.Resolve(tc.src, tc.dst, tc.tp, 1)
			if err != nil {
				t.Fatal(err)
			}
			l, err := transfer.BuildLayout(tc.src, d)
			if err != nil {
				t.Fatal(err)
			}
			p, err := transfer.BuildPlan(tc.src, d, transfer.Pages{SrcPages: []int{0, 1, 3, 2}, DstPages: []int{1, 2, 3, 0}}, "n")
			if err != nil {
				t.Fatal(err)
			}
			if l.Path != p.Path {
				t.Fatalf("layout path %s, plan path %s", l.Path, p.Path)
			}
			for i, st := range p.Steps {
				lp := l.Lists[st.List]
				gotL, gotD, err := transfer.SelectPairs(lp.Local, lp.Dst, st.LocalIdx, st.DstIdx)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(gotL, st.Local) || !reflect.DeepEqual(gotD, st.Dst) {
					t.Fatalf("step %d: prepared selection differs\n%+v\n%+v", i, gotL, st.Local)
				}
			}
		})
	}
}

func TestMissingMemKindErrorMessage(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("plan for d-1: %w", &transfer.MissingMemKindError{Agent: "d-1", Path: transfer.PathEqualTP})
	var mk *transfer.MissingMemKindError
	if !errors.As(err, &mk) || mk.Agent != "d-1" || mk.Error() != transfer.MissingMemKindMessage || transfer.MissingMemKindMessage != "Missing NIXL destination KV memory kind" {
		t.Fatalf("%v", err)
	}
}
