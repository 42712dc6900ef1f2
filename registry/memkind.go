package registry

import (
	"fmt"
	"strings"
)

// MemKind is the kind of memory a KV region lives in, numbered as NIXL
// numbers its nixl_mem_t values so that the numbers can cross the C ABI and
// the wire unchanged.
type MemKind int

// Memory kinds, as NIXL numbers them.
const (
	DRAM   MemKind = 0
	VRAM   MemKind = 1
	BLOCK  MemKind = 2
	OBJECT MemKind = 3
	FILE   MemKind = 4
)

var memKindNames = [...]string{"DRAM", "VRAM", "BLOCK", "OBJECT", "FILE"}

// Valid reports whether k is one of the kinds NIXL knows.
func (k MemKind) Valid() bool { return k >= DRAM && k <= FILE }

// String returns the NIXL name of the kind ("VRAM", "DRAM", ...).
func (k MemKind) String() string {
	if k.Valid() {
		return memKindNames[k]
	}
	return fmt.Sprintf("MemKind(%d)", int(k))
}

// ParseMemKind turns a kind name ("VRAM", case-insensitive) into a MemKind.
func ParseMemKind(s string) (MemKind, error) {
	for i, n := range memKindNames {
		if strings.EqualFold(s, n) {
			return MemKind(i), nil
		}
	}
	return 0, fmt.Errorf("unknown memory kind %q (want one of %s)", s, strings.Join(memKindNames[:], ", "))
}

// MarshalText writes the kind's name, so JSON carries "VRAM" rather than 1.
func (k MemKind) MarshalText() ([]byte, error) {
	if !k.Valid() {
		return nil, fmt.Errorf("unknown memory kind %d", int(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText parses a kind name.
func (k *MemKind) UnmarshalText(b []byte) error {
	v, err := ParseMemKind(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// HomogeneousKind returns the single kind shared by every region, and false
// when kinds is empty or mixes kinds.
func HomogeneousKind(kinds []MemKind) (MemKind, bool) {
	if len(kinds) == 0 {
		return 0, false
	}
	for _, k := range kinds[1:] {
		if k != kinds[0] {
			return 0, false
		}
	}
	return kinds[0], true
}

// Segment is a run of consecutive regions that share one (source kind,
// destination kind) pair; a transfer to a destination of mixed kinds is issued
// as one transfer per segment.
type Segment struct {
	SrcKind MemKind `json:"src_kind"`
	DstKind MemKind `json:"dst_kind"`
	Start   int     `json:"start"` // index of the first region
	Count   int     `json:"count"` // number of regions
}

// Segments splits equal-length source and destination kind lists into runs of
// equal (source, destination) kinds. It fails when the lists differ in length,
// because a region-by-region pairing is then undefined.
func Segments(src, dst []MemKind) ([]Segment, error) {
	if len(src) != len(dst) {
		return nil, fmt.Errorf("mixed memory kinds need equal region counts: source has %d, destination has %d", len(src), len(dst))
	}
	var segs []Segment
	for i := range src {
		if n := len(segs); n > 0 && segs[n-1].SrcKind == src[i] && segs[n-1].DstKind == dst[i] {
			segs[n-1].Count++
			continue
		}
		segs = append(segs, Segment{SrcKind: src[i], DstKind: dst[i], Start: i, Count: 1})
	}
	return segs, nil
}
