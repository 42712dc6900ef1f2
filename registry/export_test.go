package registry

import "time"

// NextSnapshot builds the snapshot that follows prev after the peers in
// changed changed (the new record; nil: gone), as a Mirror does; with prev
// or changed nil, it builds one whole from peers.
func NextSnapshot(prev *Snapshot, version uint64, peers []*Peer, changed map[string]*Peer, qs []Quarantine, pfs []Preflight) *Snapshot {
	return buildSnapshot(prev, snapshotInput{version: version, peers: peers, changed: changed,
		quarantines: qs, preflights: pfs, now: time.Unix(0, 0)})
}

// CompatKey is the class key of a spec: peers with equal keys are
// interchangeable in every pair.
var CompatKey = compatKey
