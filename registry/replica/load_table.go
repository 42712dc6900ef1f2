package replica

import (
	"sync/atomic"

	"github.com/pdplane/pdplane/registry"
)

// LoadTable holds the latest load of every peer, replaced as a whole on
// each refresh; snapshots share it, so a load refresh costs no snapshot
// rebuild. Reads are lock-free.
type LoadTable struct {
	cur atomic.Pointer[LoadSet]
}

// LoadSet is the loads of one refresh, immutable. Each has a slot, so that
// a reader that looks the same peers up many times (the router, per pick)
// can resolve their slots once per refresh and then read by index.
type LoadSet struct {
	slot  map[string]int32 // peer ID -> index into loads
	loads []registry.PeerLoad
}

// Set replaces the table's contents with loads.
func (t *LoadTable) Set(loads []registry.PeerLoad) {
	s := &LoadSet{slot: make(map[string]int32, len(loads)), loads: make([]registry.PeerLoad, 0, len(loads))}
	for _, l := range loads {
		if i, ok := s.slot[l.PeerID]; ok {
			s.loads[i] = l // a later entry of a peer replaces the earlier one
			continue
		}
		s.slot[l.PeerID] = int32(len(s.loads))
		s.loads = append(s.loads, l)
	}
	t.cur.Store(s)
}

// Current returns the table's contents; nil when the table is nil or was
// never set.
func (t *LoadTable) Current() *LoadSet {
	if t == nil {
		return nil
	}
	return t.cur.Load()
}

// Slot returns the peer's slot in the set, -1 when it has none (or the set
// is nil).
func (s *LoadSet) Slot(id string) int32 {
	if s == nil {
		return -1
	}
	if i, ok := s.slot[id]; ok {
		return i
	}
	return -1
}

// At returns the load in the slot; ok is false for slot -1.
func (s *LoadSet) At(slot int32) (registry.PeerLoad, bool) {
	if slot < 0 {
		return registry.PeerLoad{}, false
	}
	return s.loads[slot], true
}
