// Package registry is the domain of pdplane's peer registry: peers (engine
// instances) and their ranks, KV geometry and memory kinds, life-cycle states
// and generations, the event log, the memory-kind resolution and pairing rules
// that decide which prefill may send KV to which decode, and the Store
// interface that the PostgreSQL and in-memory stores implement.
//
// It also owns the field limits (validate.go): what text, integers and
// arrays a stored field may hold. Both stores apply the same validators
// before they change anything, so they accept and refuse the same input,
// and openapi.yaml states the same limits.
//
// It holds no SQL and does no I/O of its own; stores live in registry/pgstore
// and registry/memstore, and both pass the contract suite in
// registry/registrytest. What each replica keeps of the registry (the
// Mirror, its Snapshots and the load table) is registry/replica's.
package registry
