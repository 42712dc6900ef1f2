package kvindex

// An alternative layout, measured against the maps in BenchmarkFleet: the
// keys held in an open-addressed table of 8-byte slots that readers probe
// without a lock.

import (
	"sync"
	"sync/atomic"

	"github.com/pdplane/pdplane/kvevents"
)

// keyTable is a multiset of router keys: linear probing, 0 for empty (a key
// of 0 is stored as 1), at most 3/4 full.
type keyTable struct {
	slots []atomic.Uint64
	n     int // the writer's count
}

type keySet struct{ t atomic.Pointer[keyTable] }

func nz(k uint64) uint64 {
	if k == 0 {
		return 1
	}
	return k
}

func newKeySet() *keySet {
	s := &keySet{}
	s.t.Store(&keyTable{slots: make([]atomic.Uint64, 16)})
	return s
}

func (s *keySet) has(k uint64) bool {
	t := s.t.Load()
	k = nz(k)
	mask := uint64(len(t.slots) - 1)
	i := k & mask
	for range len(t.slots) {
		switch t.slots[i].Load() {
		case k:
			return true
		case 0:
			return false
		}
		i = (i + 1) & mask
	}
	return false
}

func (s *keySet) add(k uint64) {
	t := s.t.Load()
	if (t.n+1)*4 > len(t.slots)*3 {
		g := &keyTable{slots: make([]atomic.Uint64, 2*len(t.slots))}
		for i := range t.slots {
			if v := t.slots[i].Load(); v != 0 {
				g.insert(v)
			}
		}
		s.t.Store(g)
		t = g
	}
	t.insert(nz(k))
}

func (t *keyTable) insert(k uint64) {
	mask := uint64(len(t.slots) - 1)
	i := k & mask
	for t.slots[i].Load() != 0 {
		i = (i + 1) & mask
	}
	t.slots[i].Store(k)
	t.n++
}

// del removes one k, shifting the probe run after it back.
func (s *keySet) del(k uint64) {
	t := s.t.Load()
	k = nz(k)
	mask := uint64(len(t.slots) - 1)
	i := k & mask
	for t.slots[i].Load() != k {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		v := t.slots[j].Load()
		if v == 0 {
			break
		}
		home := v & mask
		// v may move to i if i lies on its probe path: home..j, cyclically.
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i].Store(v)
			i = j
		}
	}
	t.slots[i].Store(0)
	t.n--
}

// compactEngine is Engine with its held keys in a keySet; locked makes its
// readers take a read lock as Engine's do, to tell the layout's gain from
// the lock's.
type compactEngine struct {
	mu     sync.RWMutex
	locked bool
	held   *keySet

	blocks    map[uint64]block
	order     order
	blockSize int
	max       int
	keys      []uint64
}

func newCompactEngine(max int, locked bool) *compactEngine {
	return &compactEngine{held: newKeySet(), blocks: map[uint64]block{}, max: max, locked: locked}
}

func (e *compactEngine) Match(keys []uint64) int {
	if e.locked {
		e.mu.RLock()
		defer e.mu.RUnlock()
	}
	n := 0
	for n < len(keys) && e.held.has(keys[n]) {
		n++
	}
	return n
}

func (e *compactEngine) Apply(b kvevents.Batch) error {
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			parent := seed
			if ev.ParentHash != "" {
				p, ok := e.blocks[blockID(ev.ParentHash)]
				if !ok {
					continue
				}
				parent = p.key
			}
			e.keys = appendKeys(e.keys[:0], parent, ev.TokenIDs, ev.BlockSize)
			e.order.compact(e.blocks, len(ev.BlockHashes))
			e.lock()
			for i, h := range ev.BlockHashes {
				id := blockID(h)
				if _, ok := e.blocks[id]; ok {
					continue
				}
				for len(e.blocks) >= e.max {
					oid, seq := e.order.pop()
					if b, ok := e.blocks[oid]; ok && b.seq == seq {
						delete(e.blocks, oid)
						e.held.del(b.key)
					}
				}
				e.blocks[id] = block{key: e.keys[i], seq: e.order.push(id), media: 1}
				e.held.add(e.keys[i])
			}
			e.unlock()
		case kvevents.BlockRemoved:
			e.lock()
			for _, h := range ev.BlockHashes {
				id := blockID(h)
				if b, ok := e.blocks[id]; ok {
					delete(e.blocks, id)
					e.held.del(b.key)
				}
			}
			e.unlock()
		}
	}
	return nil
}

func (e *compactEngine) lock() {
	if e.locked {
		e.mu.Lock()
	}
}

func (e *compactEngine) unlock() {
	if e.locked {
		e.mu.Unlock()
	}
}
