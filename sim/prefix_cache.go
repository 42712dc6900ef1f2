package sim

import (
	"container/list"
	"encoding/binary"
	"hash/fnv"
	"slices"
	"sync"
)

// prefixCache is a model of what a prefill engine's prefix cache holds: the
// prompts' full blocks (a block is a KV page, Config.PageSize tokens), each
// keyed by a hash chained over every token from the prompt's start to the
// block's end, as vLLM's (v1/core/kv_cache_utils.py hash_block_tokens) and
// SGLang's radix cache key them; the least recently used block goes first
// when more than capacity (Config.Pages) are held.
//
// It is a model only: the KV bytes a request computes still go into pages
// the request allocates from the pool and frees when it is done
// (kv_pool.go). What the cache decides is how many of a prompt's tokens are
// computed (the prefill time), the counters and metrics of hits, and the KV
// events a prefill publishes (kv_events.go).
type prefixCache struct {
	blockSize, capacity int

	mu     sync.Mutex
	blocks map[uint64]*list.Element // of *cachedBlock
	lru    list.List                // most recently used first
	// queried and hit are the prompt tokens looked up and those found
	// cached, since the start; lastQueried and lastHit, the last lookup's.
	queried, hit, lastQueried, lastHit int64
	// onChange, if set, is told every change under mu, so that the changes
	// reach it in the order they were made.
	onChange func(cacheChange)
}

// cachedBlock is one block the cache holds.
type cachedBlock struct {
	hash, parent uint64 // parent: 0 for a prompt's first block
	hasParent    bool
	tokens       []int
}

// cacheChange is what one insert did: the blocks it evicted, and the runs of
// consecutive blocks it stored (a run's parent is the block before it).
type cacheChange struct {
	removed []uint64
	stored  [][]*cachedBlock
}

// rootHash seeds the hash chain of every prompt (vLLM's NONE_HASH).
const rootHash = 0x6a09e667f3bcc908

func newPrefixCache(blockSize, capacity int) *prefixCache {
	return &prefixCache{blockSize: blockSize, capacity: capacity, blocks: map[uint64]*list.Element{}}
}

// blockHashes returns the chained hashes of prompt's full blocks.
func (c *prefixCache) blockHashes(prompt []int) []uint64 {
	n := len(prompt) / c.blockSize
	out := make([]uint64, n)
	parent := uint64(rootHash)
	var b [8]byte
	for i := range out {
		h := fnv.New64a()
		binary.LittleEndian.PutUint64(b[:], parent)
		h.Write(b[:])
		for _, t := range prompt[i*c.blockSize : (i+1)*c.blockSize] {
			binary.LittleEndian.PutUint64(b[:], uint64(t))
			h.Write(b[:])
		}
		// 0 stands for "no parent" in nothing, but keep it out of the
		// chain anyway: a block hash is never 0.
		parent = mix64(h.Sum64()) | 1
		out[i] = parent
	}
	return out
}

// hitBlocks is how many of prompt's leading blocks could be taken from the
// cache: every full block but one that holds the prompt's last token, which
// the engine computes whatever it holds, to have its logits (vLLM's
// v1/core/kv_cache_manager.py get_computed_blocks: max_cache_hit_length =
// num_tokens − 1, in whole blocks; SGLang's managers/schedule_batch.py
// Req._compute_max_prefix_len: input_len − 1).
func (c *prefixCache) hitBlocks(prompt []int) int {
	return (len(prompt) - 1) / c.blockSize
}

// peek returns how many of prompt's tokens the cache holds now, changing
// nothing.
func (c *prefixCache) peek(prompt []int) int {
	hs := c.blockHashes(prompt)[:c.hitBlocks(prompt)]
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hs {
		if _, ok := c.blocks[h]; !ok {
			break
		}
		n++
	}
	return n * c.blockSize
}

// lookup returns how many of prompt's tokens the cache holds (its leading
// cached blocks' tokens), counts the lookup, and makes those blocks the
// most recently used.
func (c *prefixCache) lookup(prompt []int) int {
	hs := c.blockHashes(prompt)[:c.hitBlocks(prompt)]
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hs {
		e, ok := c.blocks[h]
		if !ok {
			break
		}
		c.lru.MoveToFront(e)
		n++
	}
	hit := n * c.blockSize
	c.queried += int64(len(prompt))
	c.hit += int64(hit)
	c.lastQueried, c.lastHit = int64(len(prompt)), int64(hit)
	return hit
}

// insert stores prompt's full blocks as the most recently used (in order,
// so that its first block is the one of them to go first), evicting the
// least recently used blocks beyond capacity. A block stored and evicted by
// the same insert (a prompt of more blocks than the cache holds) is in
// both lists of the change: stored first, then removed.
func (c *prefixCache) insert(prompt []int) {
	hs := c.blockHashes(prompt)
	c.mu.Lock()
	defer c.mu.Unlock()
	var ch cacheChange
	var run []*cachedBlock
	for i, h := range hs {
		if e, ok := c.blocks[h]; ok {
			c.lru.MoveToFront(e)
			if len(run) > 0 {
				ch.stored, run = append(ch.stored, run), nil
			}
			continue
		}
		b := &cachedBlock{hash: h, tokens: slices.Clone(prompt[i*c.blockSize : (i+1)*c.blockSize])}
		if i > 0 {
			b.parent, b.hasParent = hs[i-1], true
		}
		c.blocks[h] = c.lru.PushFront(b)
		run = append(run, b)
	}
	if len(run) > 0 {
		ch.stored = append(ch.stored, run)
	}
	for c.lru.Len() > c.capacity {
		b := c.lru.Remove(c.lru.Back()).(*cachedBlock)
		delete(c.blocks, b.hash)
		ch.removed = append(ch.removed, b.hash)
	}
	if c.onChange != nil && (len(ch.removed) > 0 || len(ch.stored) > 0) {
		c.onChange(ch)
	}
}

// cacheStats are the cache's counters.
type cacheStats struct {
	queried, hit, lastQueried, lastHit int64
}

func (c *prefixCache) stats() cacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cacheStats{queried: c.queried, hit: c.hit, lastQueried: c.lastQueried, lastHit: c.lastHit}
}
