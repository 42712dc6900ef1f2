package registry

import (
	"sync/atomic"
	"time"
)

// PeerLoad is a peer's load as its last heartbeat reported it.
type PeerLoad struct {
	PeerID string
	Load   Load
	At     time.Time // the heartbeat that carried it
}

// ReportedLoad returns the load the peer's record carries, from its last
// heartbeat as the record was read; ok is false (and only PeerID set) when
// the record has none.
func (p *Peer) ReportedLoad() (l PeerLoad, ok bool) {
	if p.LastHeartbeat == nil {
		return PeerLoad{PeerID: p.ID}, false
	}
	return PeerLoad{PeerID: p.ID, Load: p.Load, At: *p.LastHeartbeat}, true
}

// LoadTable holds the latest load of every peer, replaced as a whole on
// each refresh; snapshots share it, so a load refresh costs no snapshot
// rebuild. Reads are lock-free.
type LoadTable struct {
	m atomic.Pointer[map[string]PeerLoad]
}

// Set replaces the table's contents with loads.
func (t *LoadTable) Set(loads []PeerLoad) {
	m := make(map[string]PeerLoad, len(loads))
	for _, l := range loads {
		m[l.PeerID] = l
	}
	t.m.Store(&m)
}

// Get returns the peer's load, if the table has it.
func (t *LoadTable) Get(id string) (PeerLoad, bool) {
	if t == nil {
		return PeerLoad{}, false
	}
	m := t.m.Load()
	if m == nil {
		return PeerLoad{}, false
	}
	l, ok := (*m)[id]
	return l, ok
}
