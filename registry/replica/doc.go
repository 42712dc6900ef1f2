// Package replica keeps each control-plane replica's view of the registry:
// a Mirror follows a Store's changes (its LISTEN/NOTIFY in PostgreSQL, its
// Broadcaster in memory) and publishes immutable Snapshots of every peer,
// the pairs' verdicts and the routes the router reads without I/O, with a
// LoadTable of the peers' latest loads between snapshots, and the pair
// groups the status page draws. The rules it applies (pairing, states)
// are registry's; it only keeps their results current and cheap to read.
package replica
