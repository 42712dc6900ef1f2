package kvindex

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/pdplane/pdplane/kvevents"
)

// DefaultMaxBlocks is Config.MaxBlocks' default: above the GPU blocks of
// one engine today (80 GiB of KV cache holds 10^4 to 10^5 blocks of 16
// tokens, by model), so that lost removals or a misbehaving publisher reach
// it, or a CPU offload of hundreds of GiB, whose oldest blocks then go first.
const DefaultMaxBlocks = 1 << 20

// maxMaxBlocks bounds Config.MaxBlocks: an engine's order numbers its
// entries in 32 bits, and holds at most about twice the cap.
const maxMaxBlocks = 1 << 30

// Config bounds an Engine.
type Config struct {
	// MaxBlocks bounds the blocks one engine's index holds; past it the
	// blocks stored first are dropped first. DefaultMaxBlocks by default.
	MaxBlocks int
}

// WithDefaults returns a copy of c with every unset field filled in.
func (c Config) WithDefaults() Config {
	c.MaxBlocks = cmp.Or(c.MaxBlocks, DefaultMaxBlocks)
	return c
}

func (c Config) validate() error {
	if c.MaxBlocks < 1 || c.MaxBlocks > maxMaxBlocks {
		return fmt.Errorf("kvindex config: MaxBlocks %d: want 1 to %d", c.MaxBlocks, maxMaxBlocks)
	}
	return nil
}

// ErrMalformed is returned for a batch the index cannot take: a stored
// event whose token IDs are not its blocks' (kvevents.Decode refuses those
// too; a batch may come from elsewhere).
var ErrMalformed = errors.New("kvindex: malformed KV event")

// BlockSizeError is returned for a batch that stores blocks of another size
// than the engine's index holds: its keys could never match the router's,
// so the caller drops the engine's index (Reset) rather than mix sizes.
type BlockSizeError struct {
	Have, Got int
}

func (e *BlockSizeError) Error() string {
	return fmt.Sprintf("kvindex: blocks of %d tokens, the engine's index holds blocks of %d", e.Got, e.Have)
}

// Stats are an engine index's counts since it was made.
type Stats struct {
	// Blocks is how many blocks it holds now.
	Blocks int
	// Unkeyed counts stored blocks it left out because it could not key
	// them: their chain's parent was not in the index (dropped, or stored
	// before the index followed the engine), or they were copies to another
	// medium of blocks it did not hold.
	Unkeyed uint64
	// Evicted counts blocks dropped to stay within Config.MaxBlocks.
	Evicted uint64
}

// Engine is the index of one engine's KV blocks: which router keys
// (Keys) it holds, learnt from its KV events. One goroutine applies the
// engine's batches (Apply) while any number match requests (Match).
type Engine struct {
	// held is the keys of the blocks below, all Match reads. The writer
	// changes it event by event, each change between two increments of
	// seq and under mu: a reader that saw seq odd, or changed, reads again
	// under mu, so that it sees an event whole.
	held atomic.Pointer[keySet]
	seq  atomic.Uint64
	mu   sync.Mutex

	// apply serialises Apply and Reset; it guards the rest.
	apply     sync.Mutex
	blocks    map[uint64]block // blockID of the engine's hash → the block
	order     order
	blockSize int          // of the blocks held; 0 before the first
	size      atomic.Int64 // blockSize, for BlockSize
	max       int
	keys      []uint64 // Apply's scratch
	changes   []change // an event's to held, for commit

	n                atomic.Int64
	unkeyed, evicted atomic.Uint64
}

// change is a key added to held or removed from it.
type change struct {
	key uint64
	add bool
}

// block is what the index knows of one of the engine's blocks.
type block struct {
	key   uint64
	seq   uint32 // its entry in the order: it was stored (first) then
	media uint8  // a bit for each medium that holds it (mediumBit)
}

func newEngine(cfg Config) *Engine {
	e := &Engine{blocks: make(map[uint64]block), max: cfg.MaxBlocks}
	e.held.Store(newKeySet(0))
	return e
}

// blockID is the index's name for an engine's block hash: 8 bytes for up
// to 64. Two of the 10^6 blocks an engine may hold at once share one with
// odds of about 1 in 4·10^7, and then only mislead a pick.
func blockID(h kvevents.Hash) uint64 {
	return xxhash.Sum64String(string(h))
}

// mediumBit names a medium by a bit of block.media: the engine's GPU
// (vLLM's "GPU", or no medium at all), its CPU offload, and six more for
// whatever else it names.
func mediumBit(medium string) uint8 {
	switch medium {
	case "", "GPU":
		return 1
	case "CPU":
		return 2
	}
	return 4 << (xxhash.Sum64String(medium) % 6)
}

// Match returns how many of keys, from the first, the engine holds: the
// blocks of a request's prompt (Keys) it would not have to compute again.
func (e *Engine) Match(keys []uint64) int {
	if s := e.seq.Load(); s&1 == 0 {
		n := e.held.Load().prefix(keys)
		if e.seq.Load() == s {
			return n
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held.Load().prefix(keys)
}

// begin and end bracket a change to held.
func (e *Engine) begin() {
	e.mu.Lock()
	e.seq.Add(1)
}

func (e *Engine) end() {
	e.seq.Add(1)
	e.mu.Unlock()
}

// Len returns how many blocks the index holds.
func (e *Engine) Len() int { return int(e.n.Load()) }

// Stats returns the index's counts.
func (e *Engine) Stats() Stats {
	return Stats{Blocks: e.Len(), Unkeyed: e.unkeyed.Load(), Evicted: e.evicted.Load()}
}

// Reset drops every block and the block size: what the caller does when
// the index went stale (events lost for good, the engine restarted, an
// Apply error). Blocks stored afterwards chained from blocks stored before
// cannot be keyed (Stats.Unkeyed) until the engine stores their chains again.
func (e *Engine) Reset() {
	e.apply.Lock()
	defer e.apply.Unlock()
	e.clear()
	e.blockSize = 0
	e.size.Store(0)
}

func (e *Engine) clear() {
	e.begin()
	e.held.Store(newKeySet(0))
	e.end()
	e.blocks = make(map[uint64]block)
	e.order = order{}
	e.n.Store(0)
}

// Apply applies one batch of the engine's KV events, in order. A batch it
// cannot take (ErrMalformed, *BlockSizeError) changes nothing; the engine's
// index is then stale, and the caller resets it. Events of KV cache groups
// other than the first are left out: for a hybrid model, the first group's
// blocks stand for the engine's.
func (e *Engine) Apply(b kvevents.Batch) error {
	e.apply.Lock()
	defer e.apply.Unlock()
	if err := e.check(b); err != nil {
		return err
	}
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.GroupIdx != 0 {
			continue
		}
		switch ev.Kind {
		case kvevents.BlockStored:
			e.store(ev)
		case kvevents.BlockRemoved:
			e.remove(ev)
		case kvevents.AllBlocksCleared:
			e.clear()
		}
	}
	// A huge batch's scratch goes with it, not kept for the next.
	if cap(e.keys) > maxScratch {
		e.keys = nil
	}
	if cap(e.changes) > maxScratch {
		e.changes = nil
	}
	return nil
}

// maxScratch bounds the scratch an engine keeps between batches: room for
// more keys than an engine step stores.
const maxScratch = 1 << 12

// check refuses a batch before any of it is applied.
func (e *Engine) check(b kvevents.Batch) error {
	size := e.blockSize
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.GroupIdx != 0 || ev.Kind != kvevents.BlockStored || len(ev.TokenIDs) == 0 {
			continue
		}
		if ev.BlockSize < 1 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
			return fmt.Errorf("%w: events[%d] stores %d blocks of %d with %d token IDs",
				ErrMalformed, i, len(ev.BlockHashes), ev.BlockSize, len(ev.TokenIDs))
		}
		if size == 0 {
			size = ev.BlockSize
		}
		if ev.BlockSize != size {
			return fmt.Errorf("events[%d]: %w", i, &BlockSizeError{Have: size, Got: ev.BlockSize})
		}
	}
	return nil
}

// store indexes a BlockStored event's blocks. An event without token IDs
// tells of copies to another medium (vLLM's offloading connectors publish
// them so): they add the medium to blocks the index holds.
func (e *Engine) store(ev *kvevents.Event) {
	m := mediumBit(ev.Medium)
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			id := blockID(h)
			if b, ok := e.blocks[id]; ok {
				b.media |= m
				e.blocks[id] = b
			} else {
				e.unkeyed.Add(1)
			}
		}
		return
	}
	e.blockSize = ev.BlockSize
	e.size.Store(int64(ev.BlockSize))
	if ev.Extra {
		// Keyed by more than their tokens (a LoRA, extra keys): no
		// request's token keys name them, nor their children.
		e.unkeyed.Add(uint64(len(ev.BlockHashes)))
		return
	}
	parent := seed
	if ev.ParentHash != "" {
		p, ok := e.blocks[blockID(ev.ParentHash)]
		if !ok {
			e.unkeyed.Add(uint64(len(ev.BlockHashes)))
			return
		}
		parent = p.key
	}
	e.keys = appendKeys(e.keys[:0], parent, ev.TokenIDs, ev.BlockSize)
	e.order.compact(e.blocks, len(ev.BlockHashes))
	for i, h := range ev.BlockHashes {
		e.put(blockID(h), e.keys[i], m)
	}
	e.commit()
}

// commit makes an event's changes to held, in order, as one change that
// readers see whole. Only they are made between begin and end, so that a
// reader seldom finds the writer there.
func (e *Engine) commit() {
	if len(e.changes) == 0 {
		return
	}
	adds := 0
	for _, c := range e.changes {
		if c.add {
			adds++
		}
	}
	// A larger set is a copy: readers may go on reading the old one. The
	// cap holds the blocks, and so the keys, to e.max at every step.
	held := e.held.Load()
	held = held.withRoom(min(adds, e.max-held.n), e.max)
	e.held.Store(held)
	e.begin()
	for _, c := range e.changes {
		if c.add {
			held.add(c.key)
		} else {
			held.remove(c.key)
		}
	}
	e.end()
	e.changes = e.changes[:0]
	e.n.Store(int64(len(e.blocks)))
}

// put indexes one block.
func (e *Engine) put(id, key uint64, m uint8) {
	if b, ok := e.blocks[id]; ok {
		if b.key == key {
			b.media |= m
			e.blocks[id] = b
			return
		}
		// The engine named other tokens by the same hash: the later wins.
		e.drop(id, b)
	}
	for len(e.blocks) >= e.max {
		e.evictOldest()
	}
	e.blocks[id] = block{key: key, seq: e.order.push(id), media: m}
	e.changes = append(e.changes, change{key: key, add: true})
}

// drop forgets a block.
func (e *Engine) drop(id uint64, b block) {
	delete(e.blocks, id)
	e.changes = append(e.changes, change{key: b.key})
}

// evictOldest drops the block stored first.
func (e *Engine) evictOldest() {
	for {
		id, seq := e.order.pop()
		if b, ok := e.blocks[id]; ok && b.seq == seq {
			e.drop(id, b)
			e.evicted.Add(1)
			return
		}
	}
}

// remove takes a BlockRemoved event's medium off its blocks, and drops
// those no medium holds any more.
func (e *Engine) remove(ev *kvevents.Event) {
	m := mediumBit(ev.Medium)
	for _, h := range ev.BlockHashes {
		id := blockID(h)
		b, ok := e.blocks[id]
		if !ok {
			continue
		}
		if b.media &^= m; b.media != 0 {
			e.blocks[id] = b
			continue
		}
		e.drop(id, b)
	}
	e.commit()
}

// NewEngine returns an empty index of one engine's blocks. The caller keeps
// one per engine, and drops it when the engine leaves.
func NewEngine(cfg Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newEngine(cfg), nil
}

// BlockSize is the tokens of the blocks the index holds; 0 before the
// engine stored any, and after a Reset.
func (e *Engine) BlockSize() int { return int(e.size.Load()) }
