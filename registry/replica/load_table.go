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

// LoadSet is the loads of one refresh, immutable.
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

// Get returns the peer's load in the set; ok is false when it has none (or
// the set is nil).
func (s *LoadSet) Get(id string) (l registry.PeerLoad, ok bool) {
	if s == nil {
		return l, false
	}
	i, ok := s.slot[id]
	if !ok {
		return l, false
	}
	return s.loads[i], true
}
