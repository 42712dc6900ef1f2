// Package transfer is pdplane's KV transfer worker: it turns what the control
// plane knows about a prefill rank and a decode rank (their KV geometry and the
// memory kind of every region) plus the page indices of one request into
// descriptor lists, and moves those bytes through a Backend.
//
// It owns:
//
//   - the Backend interface that the NIXL binding (transfer/nixl) and the
//     pure-Go TCP backend (transfer/tcp) implement, and the descriptor,
//     notification and error vocabulary they share;
//   - the plan (BuildPlan): the mla, equal_tp, mixed_segments and hetero_tp
//     paths, and the invariant that raises *MissingMemKindError in exactly the
//     state in which SGLang raises "Missing NIXL destination KV memory kind";
//   - the remote-metadata cache (RemoteCache) keyed by peer and generation,
//     which invalidates a peer's old metadata and prepared descriptor lists
//     before it loads the new ones;
//   - a worker pool with bounded queues (Pool) and the Worker that ties the
//     cache, the plan and the pool together;
//   - off-heap host memory (HostBuffer) for KV pools that a backend may
//     register.
//
// It does not talk to the control plane, the database or an engine: the agent
// carries metadata and geometry in and reports the typed errors out. Memory
// kinds are registry.MemKind; this package never redefines them.
package transfer
