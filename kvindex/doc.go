// Package kvindex is the router's index of which KV blocks each engine
// holds, built from the engines' KV events (kvevents), so that a request's
// prefill can go to the engine that already holds the longest prefix of its
// prompt. It does no I/O: the events come from kvevents' streams, a
// request's token IDs from the router; and it chooses no route.
//
// # Block keys
//
// An engine names a block by its own hash (vLLM: sha256 of its serialised
// tokens and extra keys, chained from a seed drawn per process unless
// PYTHONHASHSEED is set), which the router cannot compute. The
// index keys blocks by the router's own chained 64-bit keys instead (Keys:
// xxhash64 of the previous block's key and the block's token IDs), and
// learns each engine hash's key from the BlockStored event that carries the
// block's token IDs: the first block of an event is chained from its
// parent's key, found by the parent's engine hash. A chain whose parent the
// index does not hold cannot be keyed and is left out (Stats.Unkeyed).
//
// A key sees token IDs only. Blocks an engine hashes with more than their
// tokens (a LoRA adapter, a multimodal input's hash, a cache salt: the
// events' lora_id, lora_name and extra_keys, kvevents.Event.Extra) match no
// request's keys, so they are left out, and so are the blocks chained from
// them (Stats.Unkeyed). A request made with a LoRA or extra keys is still
// scored by its tokens alone, against the base model's blocks: at worst a
// worse pick.
//
// # One index per engine
//
// Each Engine follows one engine's events only: BlockStored (a copy to
// another medium, without token IDs, adds the medium to a block it holds),
// BlockRemoved (by medium: a block counts while any medium holds it, since a
// block offloaded to CPU still saves compute) and AllBlocksCleared. Events of
// KV cache groups other than the first are left out. A batch storing blocks
// of another size than the engine's is refused whole (BlockSizeError): the
// caller then resets the engine's index, as it does when events were lost
// for good or the engine restarted, and drops the Engine of a peer that left.
//
// The engine evicts its own blocks (LRU) and says so; the index's cap
// (Config.MaxBlocks, dropping the blocks stored first) only matters when
// removals were lost or a publisher misbehaves, and it bounds the index's
// memory whatever the publisher sends.
//
// # Layout
//
// What Match reads, the keys an engine holds, is an open-addressed table of
// 8-byte slots (keySet) that readers probe without taking a lock; the
// engine hashes stay in a Go map, which only the goroutine applying events
// touches. A pick looks at every candidate engine on every request, and the
// table is what makes that cheap: at 1,000 engines of 100,000 blocks a pick
// took 3.1 times less than with the keys in a Go map under a sync.RWMutex
// (1.7 times when every engine held 16 of the request's blocks, 6 times with
// two goroutines picking or one applying events meanwhile), for about the
// same memory, 65 bytes a block (BENCHMARKS.md, whose benchmark keeps the
// maps to measure against). The memory cannot halve as long as each
// engine hash has to map to its key, which a Go map already does in some 36
// bytes a block.
//
// The writer moves a sequence number before and after each event's changes;
// a reader that saw it move reads again under the writer's mutex, so that
// it sees an event whole, never half of it.
package kvindex
