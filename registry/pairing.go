package registry

import (
	"fmt"
	"strconv"
	"strings"
)

// Path is the way KV moves from a prefill to a decode, as SGLang's NIXL
// connector chooses it.
type Path string

// Transfer paths.
const (
	// PathMLA: either side uses MLA; every rank holds the whole latent KV.
	PathMLA Path = "mla"
	// PathEqualTP: both sides split attention heads over the same number of
	// ranks, so pages move whole from rank i to rank i.
	PathEqualTP Path = "equal_tp"
	// PathHeteroTP: attention TP sizes differ, so each page is sliced by head;
	// supported only into VRAM.
	PathHeteroTP Path = "hetero_tp"
	// PathMixedSegments: the destination mixes memory kinds, so the transfer
	// is issued once per run of equal (source, destination) kinds.
	PathMixedSegments Path = "mixed_segments"
)

// NeedsMemKind reports whether the transfer on this path must know the
// destination's memory kind (a homogeneous kind or segments); on these paths
// a destination with neither is SGLang's "Missing NIXL destination KV memory
// kind".
func (p Path) NeedsMemKind() bool {
	return p == PathMLA || p == PathEqualTP || p == PathMixedSegments
}

// Verdict says whether a prefill may send KV to a decode, by which path, and
// why not when it may not.
//
// A compatible verdict lists in Unverified the rules it could not check
// because a field was unknown on one side (a stock engine publishes no KV
// regions or memory kinds); Path is empty when the path itself is unknown.
type Verdict struct {
	Compatible bool     `json:"compatible"`
	Path       Path     `json:"path,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Unverified []string `json:"unverified,omitempty"`
}

// Verified reports whether every pairing rule was checked on known values.
func (v Verdict) Verified() bool { return len(v.Unverified) == 0 }

// What a compatible verdict may name as unverified.
const (
	UnverifiedIsMLA    = "kv.is_mla"
	UnverifiedPath     = "path"
	UnverifiedRegions  = "ranks[*].kv_data_ptrs"
	UnverifiedMemKinds = "ranks[*].kv_mem_kinds"
)

func refuse(format string, args ...any) Verdict {
	return Verdict{Reason: fmt.Sprintf(format, args...)}
}

// CheckPair applies the pairing rules to a (prefill, decode) pair of specs.
// It looks only at what the engines declared or published, not at
// life-cycle state, so its answer stays valid for as long as neither peer
// re-registers. A rule whose inputs are unknown on either side is not
// guessed: it is skipped and named in the verdict's Unverified, while a
// mismatch between known values still refuses the pair.
func CheckPair(prefill, decode *PeerSpec) Verdict {
	switch {
	case !prefill.Role.Prefills():
		return refuse("%s cannot prefill (role %s)", prefill.Name, prefill.Role)
	case !decode.Role.Decodes():
		return refuse("%s cannot decode (role %s)", decode.Name, decode.Role)
	case prefill.Name == decode.Name:
		return refuse("a peer does not pair with itself")
	}
	if v, ok := checkShape(prefill, decode); !ok {
		return v
	}
	return checkMemKinds(prefill, decode)
}

// checkShape applies every rule that does not involve memory kinds.
func checkShape(p, d *PeerSpec) (Verdict, bool) {
	switch {
	case p.Engine.Protocol() != d.Engine.Protocol():
		return refuse("engine protocols differ: prefill speaks %s, decode speaks %s", p.Engine.Protocol(), d.Engine.Protocol()), false
	case p.Model != d.Model:
		return refuse("models differ: prefill serves %q, decode serves %q", p.Model, d.Model), false
	case (p.TransferGroup != "" || d.TransferGroup != "") && p.TransferGroup != d.TransferGroup:
		return refuse("transfer groups differ: prefill in %q, decode in %q", p.TransferGroup, d.TransferGroup), false
	case p.KV.PageSize != d.KV.PageSize:
		return refuse("page sizes differ: prefill %d, decode %d", p.KV.PageSize, d.KV.PageSize), false
	case p.KV.DType != d.KV.DType:
		return refuse("kv dtypes differ: prefill %s, decode %s", p.KV.DType, d.KV.DType), false
	case p.Knows(FieldIsMLA) && d.Knows(FieldIsMLA) && p.KV.IsMLA != d.KV.IsMLA:
		return refuse("one side uses MLA and the other does not (prefill is_mla=%t, decode is_mla=%t)", p.KV.IsMLA, d.KV.IsMLA), false
	case p.Parallelism.PPSize != d.Parallelism.PPSize && d.Parallelism.PPSize != 1:
		return refuse("pipeline parallel sizes differ: prefill pp %d, decode pp %d (decode pp must equal it or be 1)", p.Parallelism.PPSize, d.Parallelism.PPSize), false
	}
	if !p.Knows(FieldRanks) || !d.Knows(FieldRanks) {
		return Verdict{}, true
	}
	src, dst := maxRegions(p.Ranks), minRegions(d.Ranks)
	if dst < src {
		return refuse("decode has fewer KV regions (%d) than the prefill sends (%d)", dst, src), false
	}
	return Verdict{}, true
}

// TransferPath is the path SGLang takes between the two geometries, or ""
// when it depends on an unknown MLA flag.
func TransferPath(prefill, decode *PeerSpec) Path {
	switch {
	case prefill.KV.IsMLA || decode.KV.IsMLA:
		return PathMLA
	case !prefill.Knows(FieldIsMLA) || !decode.Knows(FieldIsMLA):
		return ""
	case prefill.Parallelism.AttnTPSize == decode.Parallelism.AttnTPSize:
		return PathEqualTP
	default:
		return PathHeteroTP
	}
}

// unverifiedShape names the shape rules checkShape skipped for unknowns.
func unverifiedShape(p, d *PeerSpec) []string {
	var out []string
	if !p.Knows(FieldIsMLA) || !d.Knows(FieldIsMLA) {
		out = append(out, UnverifiedIsMLA)
	}
	if !p.Knows(FieldRanks) || !d.Knows(FieldRanks) {
		out = append(out, UnverifiedRegions)
	}
	return out
}

// checkMemKinds resolves the destination memory kind of every decode rank for
// the path the pair would take.
func checkMemKinds(p, d *PeerSpec) Verdict {
	path := TransferPath(p, d)
	unverified := unverifiedShape(p, d)
	if path == "" {
		unverified = append(unverified, UnverifiedPath)
	}
	if !d.Knows(FieldRanks) || path == "" {
		// Without the destination's kinds, or without knowing whether the
		// path needs them, nothing about memory kinds can be resolved.
		return Verdict{Compatible: true, Path: path, Unverified: append(unverified, UnverifiedMemKinds)}
	}
	mixed := false
	for i := range d.Ranks {
		dr := &d.Ranks[i]
		field := fmt.Sprintf("decode ranks[%d].kv_mem_kinds", i)
		if len(dr.KVMemKinds) != len(dr.KVDataPtrs) {
			return refuse("%s: destination memory kind unresolvable (%d kinds for %d regions)", field, len(dr.KVMemKinds), len(dr.KVDataPtrs))
		}
		if path == PathHeteroTP {
			for j, k := range dr.KVMemKinds {
				if k != VRAM {
					return refuse("heterogeneous TP (prefill attn_tp %d, decode attn_tp %d) supports only VRAM destinations; %s[%d] is %s",
						p.Parallelism.AttnTPSize, d.Parallelism.AttnTPSize, field, j, k)
				}
			}
			continue
		}
		if _, ok := HomogeneousKind(dr.KVMemKinds); ok {
			continue
		}
		if !p.Knows(FieldRanks) {
			// Mixed destination kinds resolve only against the source's.
			return Verdict{Compatible: true, Path: PathMixedSegments, Unverified: append(unverified, UnverifiedMemKinds)}
		}
		sr := &p.Ranks[i%len(p.Ranks)]
		if _, err := Segments(sr.KVMemKinds, dr.KVMemKinds); err != nil {
			return refuse("%s: %v", field, err)
		}
		mixed = true
	}
	if mixed {
		path = PathMixedSegments
	}
	return Verdict{Compatible: true, Path: path, Unverified: unverified}
}

func maxRegions(ranks []Rank) int {
	n := 0
	for i := range ranks {
		n = max(n, len(ranks[i].KVDataPtrs))
	}
	return n
}

func minRegions(ranks []Rank) int {
	if len(ranks) == 0 {
		return 0
	}
	n := len(ranks[0].KVDataPtrs)
	for i := range ranks[1:] {
		n = min(n, len(ranks[i+1].KVDataPtrs))
	}
	return n
}

// CompatKey summarises every field CheckPair reads except name and role, so
// peers with equal keys get equal verdicts against any other peer. Snapshots
// compute verdicts once per pair of keys, not once per pair of peers.
func CompatKey(s *PeerSpec) string {
	// Appended by hand, not with fmt: a snapshot computes the key of every
	// peer on every rebuild, and at 10,000 peers fmt was half the rebuild.
	b := make([]byte, 0, 96+8*len(s.Ranks))
	b = append(b, s.Engine.Protocol()...)
	b = append(b, '|')
	b = strconv.AppendQuote(b, s.Model)
	b = append(b, '|')
	b = strconv.AppendQuote(b, s.TransferGroup)
	b = append(b, '|')
	b = strconv.AppendInt(b, int64(s.KV.PageSize), 10)
	b = append(b, '|')
	b = strconv.AppendQuote(b, s.KV.DType)
	b = append(b, '|')
	b = strconv.AppendBool(b, s.KV.IsMLA)
	for _, n := range []int{s.KV.NumLayers, s.Parallelism.PPSize, s.Parallelism.AttnTPSize} {
		b = append(b, '|')
		b = strconv.AppendInt(b, int64(n), 10)
	}
	for i := range s.Ranks {
		b = append(b, '|')
		for _, k := range s.Ranks[i].KVMemKinds {
			b = strconv.AppendInt(b, int64(k), 10)
		}
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(len(s.Ranks[i].KVDataPtrs)), 10)
	}
	// Unknown fields change verdicts (what is unverified), so peers that
	// know different things are different classes.
	b = append(b, "|unknown=["...)
	for i, f := range s.Unknown {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendQuote(b, f)
	}
	b = append(b, ']')
	return string(b)
}

// GeometryDiff describes how two peers' KV geometries differ, for quarantine
// records and operators.
func GeometryDiff(prefill, decode *PeerSpec) string {
	var diffs []string
	add := func(name string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			diffs = append(diffs, fmt.Sprintf("%s: prefill %v, decode %v", name, a, b))
		}
	}
	// A field one side does not know is shown as unknown, not as its zero.
	known := func(field string, a, b any) {
		switch {
		case !prefill.Knows(field) && !decode.Knows(field):
		case !prefill.Knows(field):
			add(strings.TrimPrefix(field, "kv."), "unknown", b)
		case !decode.Knows(field):
			add(strings.TrimPrefix(field, "kv."), a, "unknown")
		default:
			add(strings.TrimPrefix(field, "kv."), a, b)
		}
	}
	add("page_size", prefill.KV.PageSize, decode.KV.PageSize)
	add("dtype", prefill.KV.DType, decode.KV.DType)
	known(FieldIsMLA, prefill.KV.IsMLA, decode.KV.IsMLA)
	known(FieldNumLayers, prefill.KV.NumLayers, decode.KV.NumLayers)
	known(FieldNumKVHeads, prefill.KV.NumKVHeads, decode.KV.NumKVHeads)
	known(FieldHeadDim, prefill.KV.HeadDim, decode.KV.HeadDim)
	add("attn_tp_size", prefill.Parallelism.AttnTPSize, decode.Parallelism.AttnTPSize)
	add("pp_size", prefill.Parallelism.PPSize, decode.Parallelism.PPSize)
	if !prefill.Knows(FieldRanks) || !decode.Knows(FieldRanks) {
		known(FieldRanks, len(prefill.Ranks), len(decode.Ranks))
		if len(diffs) == 0 {
			return "no known geometry difference: ranks unknown on one side or both"
		}
		return strings.Join(diffs, "; ")
	}
	add("ranks", len(prefill.Ranks), len(decode.Ranks))
	for i := 0; i < min(len(prefill.Ranks), len(decode.Ranks)); i++ {
		add(fmt.Sprintf("ranks[%d].regions", i), len(prefill.Ranks[i].KVDataPtrs), len(decode.Ranks[i].KVDataPtrs))
		add(fmt.Sprintf("ranks[%d].kv_mem_kinds", i), prefill.Ranks[i].KVMemKinds, decode.Ranks[i].KVMemKinds)
	}
	if len(diffs) == 0 {
		return "no geometry difference: the failure is not explained by the declared geometry"
	}
	return strings.Join(diffs, "; ")
}
