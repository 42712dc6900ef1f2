package kvindex

import "sync/atomic"

// keySet is the router keys an engine holds, as Match reads them: an
// open-addressed table of 8-byte slots, probed linearly, at most 3/4 full,
// holding a key once for each block that has it. A key is never 0
// (appendKeys), the empty slot.
//
// Slots are read and written atomically: readers probe while the one writer
// adds and removes, and the Engine's sequence number tells them whether
// what they read was changed meanwhile. Once a larger copy replaces a set,
// the writer no longer changes the old one.
type keySet struct {
	slots []atomic.Uint64 // a power of two of them
	n     int             // keys held: the writer's count
}

// newKeySet returns a set with room for n keys.
func newKeySet(n int) *keySet {
	size := 16
	for size*3 < n*4 {
		size *= 2
	}
	return &keySet{slots: make([]atomic.Uint64, size)}
}

// prefix returns how many of keys, from the first, the set holds.
func (s *keySet) prefix(keys []uint64) int {
	for n, k := range keys {
		if !s.has(k) {
			return n
		}
	}
	return len(keys)
}

func (s *keySet) has(k uint64) bool {
	mask := uint64(len(s.slots) - 1)
	i := k & mask
	// Bounded, so that a reader racing the writer cannot probe forever.
	for range s.slots {
		switch s.slots[i].Load() {
		case k:
			return true
		case 0:
			return false
		}
		i = (i + 1) & mask
	}
	return false
}

// withRoom returns s if it has room for more keys, else a larger copy of
// it, with room to spare up to max keys.
func (s *keySet) withRoom(more, max int) *keySet {
	if (s.n+more)*4 <= len(s.slots)*3 {
		return s
	}
	g := newKeySet(min(2*(s.n+more), max))
	for i := range s.slots {
		if k := s.slots[i].Load(); k != 0 {
			g.add(k)
		}
	}
	return g
}

// add adds k once more; the set has room for it (withRoom).
func (s *keySet) add(k uint64) {
	mask := uint64(len(s.slots) - 1)
	i := k & mask
	for s.slots[i].Load() != 0 {
		i = (i + 1) & mask
	}
	s.slots[i].Store(k)
	s.n++
}

// remove removes k once; the set holds it. The keys probed past k's slot
// move back into the hole (no tombstones, so that misses stay short).
func (s *keySet) remove(k uint64) {
	mask := uint64(len(s.slots) - 1)
	i := k & mask
	for s.slots[i].Load() != k {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		v := s.slots[j].Load()
		if v == 0 {
			break
		}
		// v may move to the hole at i if i lies on its probe path, from
		// its home slot to j, cyclically.
		if home := v & mask; (i < j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			s.slots[i].Store(v)
			i = j
		}
	}
	s.slots[i].Store(0)
	s.n--
}
