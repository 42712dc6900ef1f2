package replica

import (
	"time"

	"github.com/pdplane/pdplane/registry"
)

// NextSnapshot builds the snapshot that follows prev after the peers in
// changed changed (the new record; nil: gone), as a Mirror does; with prev
// or changed nil, it builds one whole from peers.
func NextSnapshot(prev *Snapshot, version uint64, peers []*registry.Peer, changed map[string]*registry.Peer, qs []registry.Quarantine, pfs []registry.Preflight) *Snapshot {
	return buildSnapshot(prev, snapshotInput{version: version, peers: peers, changed: changed,
		quarantines: qs, preflights: pfs, now: time.Unix(0, 0)})
}
