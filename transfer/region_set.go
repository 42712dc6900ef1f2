package transfer

import (
	"fmt"
	"math"
	"sort"

	"github.com/pdplane/pdplane/registry"
)

// RegionSet is a set of registered, non-overlapping memory regions, used by
// backends to refuse spans outside registered memory before they touch it.
// It is not safe for concurrent use; backends guard it.
type RegionSet struct {
	byKind map[registry.MemKind][]Desc // sorted by Addr
}

// CheckRegions validates regions to register: each must be non-empty, must
// not wrap around the address space, and must not overlap another in the
// same list.
func CheckRegions(l DescList) error {
	if !l.Kind.Valid() {
		return fmt.Errorf("memory kind %d: %w", int(l.Kind), ErrInvalidRegion)
	}
	if len(l.Descs) == 0 {
		return fmt.Errorf("no regions: %w", ErrInvalidRegion)
	}
	sorted := make([]Desc, len(l.Descs))
	copy(sorted, l.Descs)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Addr < sorted[j].Addr })
	for i, d := range sorted {
		if d.Len == 0 {
			return fmt.Errorf("region at %#x has zero length: %w", d.Addr, ErrInvalidRegion)
		}
		if d.Addr == 0 && l.Kind == registry.DRAM {
			return fmt.Errorf("region at address 0: %w", ErrInvalidRegion)
		}
		if d.Len > math.MaxUint64-d.Addr {
			return fmt.Errorf("region at %#x of %d bytes wraps around: %w", d.Addr, d.Len, ErrInvalidRegion)
		}
		if i > 0 && sorted[i-1].End() > d.Addr && sorted[i-1].DevID == d.DevID {
			return fmt.Errorf("regions at %#x and %#x: %w", sorted[i-1].Addr, d.Addr, ErrOverlap)
		}
	}
	return nil
}

// Add registers the regions of l, all or none.
func (s *RegionSet) Add(l DescList) error {
	if err := CheckRegions(l); err != nil {
		return err
	}
	cur := s.byKind[l.Kind]
	for _, d := range l.Descs {
		if o, ok := overlapping(cur, d); ok {
			return fmt.Errorf("region [%#x, %#x) overlaps registered [%#x, %#x): %w", d.Addr, d.End(), o.Addr, o.End(), ErrOverlap)
		}
	}
	if s.byKind == nil {
		s.byKind = make(map[registry.MemKind][]Desc)
	}
	next := append(append([]Desc(nil), cur...), l.Descs...)
	sort.Slice(next, func(i, j int) bool { return next[i].Addr < next[j].Addr })
	s.byKind[l.Kind] = next
	return nil
}

// Remove deregisters the regions of l, which must each match a registered
// region exactly; all or none.
func (s *RegionSet) Remove(l DescList) error {
	cur := s.byKind[l.Kind]
	keep := make([]bool, len(cur))
	for i := range keep {
		keep[i] = true
	}
	for _, d := range l.Descs {
		found := false
		for i, r := range cur {
			if keep[i] && r == d {
				keep[i] = false
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("region [%#x, %#x) of %s is not registered: %w", d.Addr, d.End(), l.Kind, ErrInvalidRegion)
		}
	}
	next := cur[:0:0]
	for i, r := range cur {
		if keep[i] {
			next = append(next, r)
		}
	}
	s.byKind[l.Kind] = next
	return nil
}

// Contains reports whether every span of l lies inside one registered
// region of l's kind (and device), and names the first span that does not.
func (s *RegionSet) Contains(l DescList) error {
	cur := s.byKind[l.Kind]
	for i, d := range l.Descs {
		if !inside(cur, d) {
			return fmt.Errorf("span %d [%#x, %#x) of %s: %w", i, d.Addr, d.Addr+d.Len, l.Kind, ErrOutOfRange)
		}
	}
	return nil
}

// Regions returns a copy of the registered regions of kind k, sorted by
// address.
func (s *RegionSet) Regions(k registry.MemKind) []Desc {
	return append([]Desc(nil), s.byKind[k]...)
}

// Kinds returns the kinds that have registered regions.
func (s *RegionSet) Kinds() []registry.MemKind {
	var ks []registry.MemKind
	for k, v := range s.byKind {
		if len(v) > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// Bytes is the registered bytes of kind k: no request for more can lie in
// the set (the regions do not overlap).
func (s *RegionSet) Bytes(k registry.MemKind) uint64 {
	var n uint64
	for _, d := range s.byKind[k] {
		n += d.Len
	}
	return n
}

// Empty reports whether nothing is registered.
func (s *RegionSet) Empty() bool { return len(s.Kinds()) == 0 }

func overlapping(sorted []Desc, d Desc) (Desc, bool) {
	for _, r := range sorted {
		if r.DevID == d.DevID && r.Addr < d.End() && d.Addr < r.End() {
			return r, true
		}
	}
	return Desc{}, false
}

func inside(sorted []Desc, d Desc) bool {
	if d.Len == 0 || d.Len > math.MaxUint64-d.Addr {
		return false
	}
	// The last region starting at or before d.Addr is the only candidate.
	i := sort.Search(len(sorted), func(i int) bool { return sorted[i].Addr > d.Addr }) - 1
	for ; i >= 0; i-- {
		r := sorted[i]
		if r.DevID != d.DevID {
			continue
		}
		return d.Addr >= r.Addr && d.End() <= r.End()
	}
	return false
}
