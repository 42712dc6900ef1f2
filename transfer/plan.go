package transfer

import (
	"errors"
	"fmt"

	"github.com/pdplane/pdplane/registry"
)

// Path names how the KV pages of a (source, destination) pair are laid out
// into descriptors. The names match SGLang's NIXL connector.
type Path string

// Transfer paths.
const (
	// PathMLA: an MLA (or hybrid-MLA) model, one buffer per layer, every
	// region to the same-index region, one homogeneous destination kind.
	PathMLA Path = "mla"
	// PathEqualTP: an MHA model with equal attention-TP sizes on both
	// sides, K layers to K layers and V layers to V layers, one homogeneous
	// destination kind.
	PathEqualTP Path = "equal_tp"
	// PathMixedSegments: a kind-needing path whose regions mix memory kinds;
	// one transfer per segment of equal (source kind, destination kind),
	// notifications suffixed "_part_<i>_<n>".
	PathMixedSegments Path = "mixed_segments"
	// PathHeteroTP: an MHA model with different attention-TP sizes; every
	// token slot of a page is sliced by head. VRAM destinations only.
	PathHeteroTP Path = "hetero_tp"
)

// RankGeometry is the KV layout of one rank as it registers it: per region
// (a K or V buffer of one layer, or one buffer per layer for MLA) the base
// address, the total length, the bytes of one page (item) and the memory
// kind. For MHA the first half of the regions are the K buffers and the
// second half the V buffers.
type RankGeometry struct {
	AgentName  string             `json:"agent_name"`   // the rank's NIXL agent name
	KVDataPtrs []uint64           `json:"kv_data_ptrs"` // base address per region
	KVDataLens []uint64           `json:"kv_data_lens"` // bytes per region
	KVItemLens []uint64           `json:"kv_item_lens"` // bytes of one page per region
	KVMemKinds []registry.MemKind `json:"kv_mem_kinds"` // memory kind per region
	GPUID      uint64             `json:"gpu_id"`       // device id of VRAM regions
}

// Regions returns the rank's regions grouped by kind, ready to register.
func (g RankGeometry) Regions() []DescList {
	var out []DescList
	idx := map[registry.MemKind]int{}
	for i, p := range g.KVDataPtrs {
		k := g.KVMemKinds[i]
		j, ok := idx[k]
		if !ok {
			j = len(out)
			idx[k] = j
			out = append(out, DescList{Kind: k})
		}
		out[j].Descs = append(out[j].Descs, Desc{Addr: p, Len: g.KVDataLens[i], DevID: devID(k, g.GPUID)})
	}
	return out
}

func (g RankGeometry) validate(side string) error {
	n := len(g.KVDataPtrs)
	if n == 0 {
		return &GeometryError{Side: side, Field: "kv_data_ptrs", Reason: "no regions"}
	}
	for field, m := range map[string]int{"kv_data_lens": len(g.KVDataLens), "kv_item_lens": len(g.KVItemLens), "kv_mem_kinds": len(g.KVMemKinds)} {
		if m != n {
			return &GeometryError{Side: side, Field: field, Reason: fmt.Sprintf("%d entries for %d regions", m, n)}
		}
	}
	for i := range n {
		if g.KVItemLens[i] == 0 {
			return &GeometryError{Side: side, Field: "kv_item_lens", Reason: fmt.Sprintf("region %d has a zero item length", i)}
		}
		if g.KVDataLens[i] < g.KVItemLens[i] {
			return &GeometryError{Side: side, Field: "kv_data_lens", Reason: fmt.Sprintf("region %d holds %d bytes, less than one %d-byte item", i, g.KVDataLens[i], g.KVItemLens[i])}
		}
		if !g.KVMemKinds[i].Valid() {
			return &GeometryError{Side: side, Field: "kv_mem_kinds", Reason: fmt.Sprintf("region %d has unknown kind %d", i, int(g.KVMemKinds[i]))}
		}
	}
	return nil
}

func (g RankGeometry) slots(i int) int { return int(g.KVDataLens[i] / g.KVItemLens[i]) }

// Source is the local (prefill) rank and the model facts that pick a path.
type Source struct {
	Geometry   RankGeometry // the prefill rank's regions
	MLA        bool         // the attention backend is MLA
	HybridMLA  bool         // the attention backend is hybrid MLA
	AttnTPSize int          // attention TP size of the prefill
	AttnTPRank int          // this rank's engine rank (within the attention TP group modulo size)
	PageSize   int          // tokens per page; needed by hetero_tp only
	// TotalKVHeads is the number of KV heads of the model across all TP
	// ranks; needed by hetero_tp only.
	TotalKVHeads int
}

// needsKind reports whether the pair is on a path that needs a destination
// memory kind: MLA, hybrid MLA, or equal attention-TP sizes.
func (s Source) needsKind(d *Destination) bool {
	return s.MLA || s.HybridMLA || d.AttnTPSize == s.AttnTPSize
}

// Destination is what the transfer worker holds for a remote (decode) rank
// once its registration has been prepared on this side: its geometry and
// the resolved memory kind, either one homogeneous kind or segments.
type Destination struct {
	Geometry   RankGeometry // the decode rank's regions
	AttnTPSize int          // attention TP size of the decode
	AttnTPRank int          // the decode rank's TP rank

	// Kind is the homogeneous destination kind; valid when HasKind.
	Kind    registry.MemKind
	HasKind bool // Kind was resolved
	// Segments is set (non-nil) when the regions mix kinds; each segment is
	// transferred separately.
	Segments []registry.Segment
}

// Resolve prepares a destination for transfers from src, as SGLang's
// _prepare_payload_xfer does: on a kind-needing path it records the
// homogeneous destination kind, or the segments when kinds are mixed; on
// the hetero_tp path it requires VRAM. A geometry that cannot be resolved is
// refused here, with the field at fault, so that a resolved destination never
// reaches the missing-kind state.
func Resolve(src Source, dst RankGeometry, dstAttnTPSize, dstAttnTPRank int) (*Destination, error) {
	if err := src.Geometry.validate("source"); err != nil {
		return nil, err
	}
	if err := dst.validate("destination"); err != nil {
		return nil, err
	}
	if src.AttnTPSize <= 0 {
		return nil, &GeometryError{Side: "source", Field: "attn_tp_size", Reason: "must be positive"}
	}
	if dstAttnTPSize <= 0 {
		return nil, &GeometryError{Side: "destination", Field: "attn_tp_size", Reason: "must be positive"}
	}
	nSrc, nDst := len(src.Geometry.KVDataPtrs), len(dst.KVDataPtrs)
	if nDst < nSrc {
		return nil, &GeometryError{Side: "destination", Field: "kv_data_ptrs", Reason: fmt.Sprintf("%d regions, fewer than the source's %d", nDst, nSrc)}
	}
	d := &Destination{Geometry: dst, AttnTPSize: dstAttnTPSize, AttnTPRank: dstAttnTPRank}
	dstKind, dstHomo := registry.HomogeneousKind(dst.KVMemKinds)
	_, srcHomo := registry.HomogeneousKind(src.Geometry.KVMemKinds)
	if src.needsKind(d) {
		if dstHomo && srcHomo {
			d.Kind, d.HasKind = dstKind, true
			return d, nil
		}
		segs, err := registry.Segments(src.Geometry.KVMemKinds, dst.KVMemKinds)
		if err != nil {
			return nil, &GeometryError{Side: "destination", Field: "kv_mem_kinds", Reason: err.Error()}
		}
		d.Segments = segs
		return d, nil
	}
	if !dstHomo {
		return nil, &GeometryError{Side: "destination", Field: "kv_mem_kinds", Reason: "heterogeneous attention TP needs one memory kind for every region"}
	}
	if dstKind != registry.VRAM {
		return nil, fmt.Errorf("heterogeneous attention TP needs VRAM destinations, destination is %s: %w", dstKind, ErrUnsupportedKind)
	}
	if !srcHomo {
		return nil, &GeometryError{Side: "source", Field: "kv_mem_kinds", Reason: "heterogeneous attention TP needs one memory kind for every region"}
	}
	d.Kind, d.HasKind = dstKind, true
	return d, nil
}

// ChoosePath returns the path a transfer from src to dst takes, and checks
// the invariant of that path. On a kind-needing path (MLA, hybrid MLA, equal
// attention-TP) a destination with neither segments nor a homogeneous kind
// yields *MissingMemKindError — exactly the state in which SGLang raises
// "Missing NIXL destination KV memory kind". hetero_tp with anything but a
// homogeneous VRAM destination is refused with ErrUnsupportedKind.
func ChoosePath(src Source, dst *Destination) (Path, error) {
	if dst == nil {
		return "", &MissingMemKindError{}
	}
	if src.needsKind(dst) {
		path := PathEqualTP
		if src.MLA || src.HybridMLA {
			path = PathMLA
		}
		if dst.Segments == nil {
			if !dst.HasKind {
				return path, &MissingMemKindError{Agent: dst.Geometry.AgentName, Path: path}
			}
			return path, nil
		}
		if len(dst.Segments) == 0 {
			return PathMixedSegments, fmt.Errorf("missing mixed kv transfer plan for %s: %w", dst.Geometry.AgentName, ErrInvalidDescs)
		}
		return PathMixedSegments, nil
	}
	if !dst.HasKind || dst.Kind != registry.VRAM {
		kind := "no homogeneous kind"
		if dst.HasKind {
			kind = dst.Kind.String()
		}
		return PathHeteroTP, fmt.Errorf("heterogeneous attention TP needs VRAM destinations, destination has %s: %w", kind, ErrUnsupportedKind)
	}
	return PathHeteroTP, nil
}

// Pages are the page indices of one request: SrcPages[i] on the source goes
// to DstPages[i] on the destination.
type Pages struct {
	SrcPages []int // page indices on the source (prefill)
	DstPages []int // page indices on the destination (decode)
}

// Plan is the descriptor lists of one request, one Step per transfer.
type Plan struct {
	Path  Path   // the path the pair takes
	Steps []Step // one per transfer
}

// Step is one transfer of a plan, in two equivalent forms: the flat lists
// (contiguous pages merged) for a one-off transfer, and indices into the
// prepared lists of Layout.Lists[List] for a prepared transfer.
type Step struct {
	Local DescList // source spans, contiguous pages merged
	Dst   DescList // destination spans, pairing with Local
	Notif string   // the notification of this transfer

	List     int   // index into Layout.Lists of the prepared pair
	LocalIdx []int // indices into that pair's Local list
	DstIdx   []int // indices into that pair's Dst list
}

// Bytes returns the bytes the plan moves.
func (p *Plan) Bytes() uint64 {
	var n uint64
	for _, s := range p.Steps {
		n += s.Local.Bytes()
	}
	return n
}

// Layout is the set of descriptor-list pairs prepared once per destination
// (every slot of every region pair), from which a Plan's steps pick by
// index.
type Layout struct {
	Path  Path       // the path the pair takes
	Lists []ListPair // one pair for the whole rank, or one per segment
}

// ListPair is one prepared pair of lists: local spans and destination
// spans, in the same memory kinds as the segment (or whole rank) they cover.
type ListPair struct {
	Local DescList // every slot of the source regions
	Dst   DescList // every slot of the destination regions
}

// regionPair is one (source region, destination region) pair of a path.
type regionPair struct {
	src, dst int
}

// BuildPlan turns one request's pages into descriptor lists for the path
// the pair takes (see ChoosePath, whose invariant errors it returns as is).
// If DstPages is shorter than SrcPages the extra source pages are dropped,
// as SGLang does; a page outside a region is ErrOutOfRange.
func BuildPlan(src Source, dst *Destination, pages Pages, notif string) (*Plan, error) {
	path, err := ChoosePath(src, dst)
	if err != nil {
		return nil, err
	}
	srcPages, dstPages := pages.SrcPages, pages.DstPages
	if len(dstPages) < len(srcPages) {
		srcPages = srcPages[:len(dstPages)]
	}
	dstPages = dstPages[:len(srcPages)]
	if len(srcPages) == 0 {
		return &Plan{Path: path}, nil
	}
	switch path {
	case PathMLA, PathEqualTP:
		pairs, err := regionPairs(src, dst, path)
		if err != nil {
			return nil, err
		}
		st, err := pageStep(src, dst, pairs, srcPages, dstPages, kindOf(src.Geometry, pairs), dst.Kind)
		if err != nil {
			return nil, err
		}
		st.Notif = notif
		return &Plan{Path: path, Steps: []Step{st}}, nil
	case PathMixedSegments:
		p := &Plan{Path: path}
		for i, seg := range dst.Segments {
			pairs := segmentPairs(seg, len(src.Geometry.KVDataPtrs))
			if len(pairs) == 0 {
				continue
			}
			st, err := pageStep(src, dst, pairs, srcPages, dstPages, seg.SrcKind, seg.DstKind)
			if err != nil {
				return nil, err
			}
			st.List = i
			st.Notif = fmt.Sprintf("%s_part_%d_%d", notif, i, len(dst.Segments))
			p.Steps = append(p.Steps, st)
		}
		return p, nil
	default:
		h, err := newHetero(src, dst)
		if err != nil {
			return nil, err
		}
		st, err := h.step(srcPages, dstPages)
		if err != nil {
			return nil, err
		}
		st.Notif = notif
		return &Plan{Path: path, Steps: []Step{st}}, nil
	}
}

// BuildLayout builds the prepared descriptor lists for a destination: for
// every region pair of the path, one span per slot (per token slot for
// hetero_tp), in the order Step indices address them.
func BuildLayout(src Source, dst *Destination) (*Layout, error) {
	path, err := ChoosePath(src, dst)
	if err != nil {
		return nil, err
	}
	switch path {
	case PathMLA, PathEqualTP:
		pairs, err := regionPairs(src, dst, path)
		if err != nil {
			return nil, err
		}
		lp, err := pageLists(src, dst, pairs, kindOf(src.Geometry, pairs), dst.Kind)
		if err != nil {
			return nil, err
		}
		return &Layout{Path: path, Lists: []ListPair{lp}}, nil
	case PathMixedSegments:
		l := &Layout{Path: path}
		for _, seg := range dst.Segments {
			lp, err := pageLists(src, dst, segmentPairs(seg, len(src.Geometry.KVDataPtrs)), seg.SrcKind, seg.DstKind)
			if err != nil {
				return nil, err
			}
			l.Lists = append(l.Lists, lp)
		}
		return l, nil
	default:
		h, err := newHetero(src, dst)
		if err != nil {
			return nil, err
		}
		return &Layout{Path: path, Lists: []ListPair{h.lists()}}, nil
	}
}

// segmentPairs pairs each region of seg with the same region on the other
// side, up to the source's srcRegions regions.
func segmentPairs(seg registry.Segment, srcRegions int) []regionPair {
	pairs := make([]regionPair, 0, seg.Count)
	for r := seg.Start; r < seg.Start+seg.Count && r < srcRegions; r++ {
		pairs = append(pairs, regionPair{src: r, dst: r})
	}
	return pairs
}

func kindOf(g RankGeometry, pairs []regionPair) registry.MemKind {
	if len(pairs) == 0 {
		return registry.DRAM
	}
	return g.KVMemKinds[pairs[0].src]
}

func devID(k registry.MemKind, gpu uint64) uint64 {
	if k == registry.VRAM {
		return gpu
	}
	return 0
}

// regionPairs maps source regions to destination regions. MLA (and hybrid
// MLA) buffers map index to index. MHA buffers are K layers then V layers on
// both sides; when the destination has more regions (decode-only
// speculative layers) its V half starts later.
func regionPairs(src Source, dst *Destination, path Path) ([]regionPair, error) {
	nSrc, nDst := len(src.Geometry.KVDataPtrs), len(dst.Geometry.KVDataPtrs)
	if nDst < nSrc {
		return nil, &GeometryError{Side: "destination", Field: "kv_data_ptrs", Reason: fmt.Sprintf("%d regions, fewer than the source's %d", nDst, nSrc)}
	}
	pairs := make([]regionPair, 0, nSrc)
	if path == PathMLA || nSrc == nDst {
		for i := range nSrc {
			pairs = append(pairs, regionPair{src: i, dst: i})
		}
		return pairs, nil
	}
	if nSrc%2 != 0 || nDst%2 != 0 {
		return nil, &GeometryError{Side: "source", Field: "kv_data_ptrs", Reason: fmt.Sprintf("MHA needs K and V halves; source has %d regions, destination %d", nSrc, nDst)}
	}
	half, dstHalf := nSrc/2, nDst/2
	for i := range half {
		pairs = append(pairs, regionPair{src: i, dst: i})
	}
	for i := range half {
		pairs = append(pairs, regionPair{src: half + i, dst: dstHalf + i})
	}
	return pairs, nil
}

// pageStep builds one step over the given region pairs: per pair, per page,
// the source item and the destination slot of the same page number, merged
// into runs where both sides are contiguous.
func pageStep(src Source, dst *Destination, pairs []regionPair, srcPages, dstPages []int, srcKind, dstKind registry.MemKind) (Step, error) {
	st := Step{Local: DescList{Kind: srcKind}, Dst: DescList{Kind: dstKind}}
	sg, dg := src.Geometry, dst.Geometry
	for pi, rp := range pairs {
		srcItem, dstItem := sg.KVItemLens[rp.src], dg.KVItemLens[rp.dst]
		if srcItem > dstItem {
			return Step{}, &GeometryError{Side: "destination", Field: "kv_item_lens", Reason: fmt.Sprintf("region %d item of %d bytes is smaller than the source's %d", rp.dst, dstItem, srcItem)}
		}
		srcSlots, dstSlots := sg.slots(rp.src), dg.slots(rp.dst)
		srcDev, dstDev := devID(srcKind, sg.GPUID), devID(dstKind, dg.GPUID)
		mergeable := srcItem == dstItem
		for i := range srcPages {
			sp, dp := srcPages[i], dstPages[i]
			if sp < 0 || sp >= srcSlots {
				return Step{}, fmt.Errorf("source page %d of region %d (%d slots): %w", sp, rp.src, srcSlots, ErrOutOfRange)
			}
			if dp < 0 || dp >= dstSlots {
				return Step{}, fmt.Errorf("destination page %d of region %d (%d slots): %w", dp, rp.dst, dstSlots, ErrOutOfRange)
			}
			st.LocalIdx = append(st.LocalIdx, pi*srcSlots+sp)
			st.DstIdx = append(st.DstIdx, pi*dstSlots+dp)
			sa := sg.KVDataPtrs[rp.src] + uint64(sp)*srcItem
			da := dg.KVDataPtrs[rp.dst] + uint64(dp)*dstItem
			if n := len(st.Local.Descs); mergeable && i > 0 && sp == srcPages[i-1]+1 && dp == dstPages[i-1]+1 &&
				st.Local.Descs[n-1].End() == sa && st.Dst.Descs[n-1].End() == da {
				st.Local.Descs[n-1].Len += srcItem
				st.Dst.Descs[n-1].Len += srcItem
				continue
			}
			st.Local.Descs = append(st.Local.Descs, Desc{Addr: sa, Len: srcItem, DevID: srcDev})
			st.Dst.Descs = append(st.Dst.Descs, Desc{Addr: da, Len: srcItem, DevID: dstDev})
		}
	}
	return st, nil
}

// pageLists builds the prepared lists over the given region pairs: every
// slot of every source region (prefill geometry) and every slot of every
// destination region (decode stride, source transfer length).
func pageLists(src Source, dst *Destination, pairs []regionPair, srcKind, dstKind registry.MemKind) (ListPair, error) {
	lp := ListPair{Local: DescList{Kind: srcKind}, Dst: DescList{Kind: dstKind}}
	sg, dg := src.Geometry, dst.Geometry
	for _, rp := range pairs {
		srcItem, dstItem := sg.KVItemLens[rp.src], dg.KVItemLens[rp.dst]
		if srcItem > dstItem {
			return ListPair{}, &GeometryError{Side: "destination", Field: "kv_item_lens", Reason: fmt.Sprintf("region %d item of %d bytes is smaller than the source's %d", rp.dst, dstItem, srcItem)}
		}
		for s := range sg.slots(rp.src) {
			lp.Local.Descs = append(lp.Local.Descs, Desc{Addr: sg.KVDataPtrs[rp.src] + uint64(s)*srcItem, Len: srcItem, DevID: devID(srcKind, sg.GPUID)})
		}
		for s := range dg.slots(rp.dst) {
			lp.Dst.Descs = append(lp.Dst.Descs, Desc{Addr: dg.KVDataPtrs[rp.dst] + uint64(s)*dstItem, Len: srcItem, DevID: devID(dstKind, dg.GPUID)})
		}
	}
	return lp, nil
}

// hetero holds the head-slice arithmetic of the hetero_tp path, as in
// SGLang's send_kvcache_slice: each token slot of a page carries the heads
// of one rank; the source sends the heads the destination rank owns (or
// the destination receives the heads this source rank owns) at the right
// offsets.
type hetero struct {
	src          Source
	dst          *Destination
	pairs        []regionPair
	pageSize     uint64
	srcItem      uint64
	dstItem      uint64
	srcTok       uint64 // bytes per token slot on the source
	dstTok       uint64 // bytes per token slot on the destination
	srcOff       uint64 // head-slice offset within a source token slot
	dstOff       uint64 // head-slice offset within a destination token slot
	sendBytes    uint64 // bytes sent per token slot
	srcSlots     int
	dstSlots     int
	srcKind      registry.MemKind
	srcDev       uint64
	dstDev       uint64
	headsPerSend int
}

var errHeteroMLA = errors.New("heterogeneous attention TP is not defined for MLA")

func newHetero(src Source, dst *Destination) (*hetero, error) {
	if src.MLA || src.HybridMLA {
		return nil, errHeteroMLA
	}
	if src.PageSize <= 0 {
		return nil, &GeometryError{Side: "source", Field: "page_size", Reason: "heterogeneous attention TP needs the page size"}
	}
	if src.TotalKVHeads <= 0 {
		return nil, &GeometryError{Side: "source", Field: "kv_heads", Reason: "heterogeneous attention TP needs the total number of KV heads"}
	}
	pairs, err := regionPairs(src, dst, PathEqualTP)
	if err != nil {
		return nil, err
	}
	if len(src.Geometry.KVDataPtrs)%2 != 0 {
		return nil, &GeometryError{Side: "source", Field: "kv_data_ptrs", Reason: "MHA needs K and V halves"}
	}
	h := &hetero{src: src, dst: dst, pairs: pairs, pageSize: uint64(src.PageSize)}
	h.srcItem, h.dstItem = src.Geometry.KVItemLens[0], dst.Geometry.KVItemLens[0]
	srcTP, dstTP := src.AttnTPSize, dst.AttnTPSize
	total := src.TotalKVHeads
	srcHeads := max(1, total/srcTP)
	dstHeads := max(1, total/dstTP)
	headBytes := h.dstItem / h.pageSize / uint64(dstHeads)
	if headBytes == 0 {
		return nil, &GeometryError{Side: "destination", Field: "kv_item_lens", Reason: fmt.Sprintf("item of %d bytes holds less than one byte per head for page size %d and %d heads", h.dstItem, src.PageSize, dstHeads)}
	}
	if srcTP > dstTP {
		// Several prefill ranks feed one decode rank: this rank's heads go
		// to their range within the decode rank's token slot.
		replication := max(1, srcTP/total)
		unique := (src.AttnTPRank % srcTP) / replication
		h.headsPerSend = srcHeads
		h.dstOff = uint64((unique*srcHeads)%dstHeads) * headBytes
	} else {
		// One prefill rank feeds several decode ranks: send the heads the
		// decode rank owns.
		h.headsPerSend = dstHeads
		h.srcOff = uint64(((dst.AttnTPRank%dstTP)*dstHeads)%srcHeads) * headBytes
	}
	h.sendBytes = uint64(h.headsPerSend) * headBytes
	h.srcTok, h.dstTok = h.srcItem/h.pageSize, h.dstItem/h.pageSize
	if h.srcOff+h.sendBytes > h.srcTok {
		return nil, &GeometryError{Side: "source", Field: "kv_item_lens", Reason: fmt.Sprintf("a token slot of %d bytes cannot hold a %d-byte head slice at offset %d", h.srcTok, h.sendBytes, h.srcOff)}
	}
	if h.dstOff+h.sendBytes > h.dstTok {
		return nil, &GeometryError{Side: "destination", Field: "kv_item_lens", Reason: fmt.Sprintf("a token slot of %d bytes cannot hold a %d-byte head slice at offset %d", h.dstTok, h.sendBytes, h.dstOff)}
	}
	h.srcSlots, h.dstSlots = src.Geometry.slots(0), dst.Geometry.slots(0)
	h.srcKind = src.Geometry.KVMemKinds[0]
	h.srcDev, h.dstDev = devID(h.srcKind, src.Geometry.GPUID), devID(dst.Kind, dst.Geometry.GPUID)
	return h, nil
}

func (h *hetero) step(srcPages, dstPages []int) (Step, error) {
	st := Step{Local: DescList{Kind: h.srcKind}, Dst: DescList{Kind: h.dst.Kind}}
	ps := int(h.pageSize)
	for pi, rp := range h.pairs {
		sBase, dBase := h.src.Geometry.KVDataPtrs[rp.src], h.dst.Geometry.KVDataPtrs[rp.dst]
		for i := range srcPages {
			sp, dp := srcPages[i], dstPages[i]
			if sp < 0 || sp >= h.srcSlots {
				return Step{}, fmt.Errorf("source page %d (%d slots): %w", sp, h.srcSlots, ErrOutOfRange)
			}
			if dp < 0 || dp >= h.dstSlots {
				return Step{}, fmt.Errorf("destination page %d (%d slots): %w", dp, h.dstSlots, ErrOutOfRange)
			}
			for t := range ps {
				st.Local.Descs = append(st.Local.Descs, Desc{Addr: sBase + uint64(sp)*h.srcItem + uint64(t)*h.srcTok + h.srcOff, Len: h.sendBytes, DevID: h.srcDev})
				st.Dst.Descs = append(st.Dst.Descs, Desc{Addr: dBase + uint64(dp)*h.dstItem + uint64(t)*h.dstTok + h.dstOff, Len: h.sendBytes, DevID: h.dstDev})
				st.LocalIdx = append(st.LocalIdx, (pi*h.srcSlots+sp)*ps+t)
				st.DstIdx = append(st.DstIdx, (pi*h.dstSlots+dp)*ps+t)
			}
		}
	}
	return st, nil
}

func (h *hetero) lists() ListPair {
	lp := ListPair{Local: DescList{Kind: h.srcKind}, Dst: DescList{Kind: h.dst.Kind}}
	ps := int(h.pageSize)
	for _, rp := range h.pairs {
		sBase, dBase := h.src.Geometry.KVDataPtrs[rp.src], h.dst.Geometry.KVDataPtrs[rp.dst]
		for s := range h.srcSlots {
			for t := range ps {
				lp.Local.Descs = append(lp.Local.Descs, Desc{Addr: sBase + uint64(s)*h.srcItem + uint64(t)*h.srcTok + h.srcOff, Len: h.sendBytes, DevID: h.srcDev})
			}
		}
		for s := range h.dstSlots {
			for t := range ps {
				lp.Dst.Descs = append(lp.Dst.Descs, Desc{Addr: dBase + uint64(s)*h.dstItem + uint64(t)*h.dstTok + h.dstOff, Len: h.sendBytes, DevID: h.dstDev})
			}
		}
	}
	return lp
}
