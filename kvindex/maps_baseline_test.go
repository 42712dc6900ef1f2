package kvindex

// The layout the Engine's key set replaced, kept for BenchmarkFleet to
// measure against: the keys held in a Go map, with a count, read under a
// sync.RWMutex, write-locked only to change them. It applies stored and
// removed events as Engine does, less the checks, media and counters.

import (
	"sync"

	"github.com/pdplane/pdplane/kvevents"
)

type mapsEngine struct {
	mu   sync.RWMutex
	held map[uint64]uint32

	blocks  map[uint64]block
	order   order
	max     int
	keys    []uint64
	changes []change
}

func newMapsEngine(max int) *mapsEngine {
	return &mapsEngine{held: map[uint64]uint32{}, blocks: map[uint64]block{}, max: max}
}

func (e *mapsEngine) Match(keys []uint64) int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	n := 0
	for n < len(keys) {
		if _, ok := e.held[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

func (e *mapsEngine) Apply(b kvevents.Batch) error {
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
			for i, h := range ev.BlockHashes {
				id := blockID(h)
				if _, ok := e.blocks[id]; ok {
					continue
				}
				for len(e.blocks) >= e.max {
					oid, seq := e.order.pop()
					if b, ok := e.blocks[oid]; ok && b.seq == seq {
						e.drop(oid, b)
					}
				}
				e.blocks[id] = block{key: e.keys[i], seq: e.order.push(id), media: 1}
				e.changes = append(e.changes, change{key: e.keys[i], add: true})
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				id := blockID(h)
				if b, ok := e.blocks[id]; ok {
					e.drop(id, b)
				}
			}
		}
		e.commit()
	}
	return nil
}

func (e *mapsEngine) drop(id uint64, b block) {
	delete(e.blocks, id)
	e.changes = append(e.changes, change{key: b.key})
}

func (e *mapsEngine) commit() {
	e.mu.Lock()
	for _, c := range e.changes {
		if c.add {
			e.held[c.key]++
		} else if n := e.held[c.key]; n > 1 {
			e.held[c.key] = n - 1
		} else {
			delete(e.held, c.key)
		}
	}
	e.mu.Unlock()
	e.changes = e.changes[:0]
}
