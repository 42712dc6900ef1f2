package kvindex

import "slices"

// minOrder is the slack the order keeps before it compacts.
const minOrder = 1024

// order is the blocks in the order they were stored, for the cap to drop
// the oldest first. Removing a block leaves its entry behind (its block is
// gone, or was stored again under a later entry); compact drops those
// entries once they outnumber the live ones, so that the order holds at
// most twice the engine's blocks and one event's.
type order struct {
	ids  []uint64 // ids[i] is entry base+i
	head int      // ids[:head] were popped
	base uint32
}

func (o *order) push(id uint64) uint32 {
	o.ids = append(o.ids, id)
	return o.base + uint32(len(o.ids)-1)
}

// pop returns the oldest entry. The order is not empty: every block has
// an entry.
func (o *order) pop() (id uint64, seq uint32) {
	id, seq = o.ids[o.head], o.base+uint32(o.head)
	o.head++
	return id, seq
}

// compact drops the entries of blocks no longer held, or held under a
// later entry, when adding more would make the entries more than twice
// the blocks; it numbers the entries kept afresh, in blocks.
func (o *order) compact(blocks map[uint64]block, more int) {
	if len(o.ids)+more <= 2*len(blocks)+minOrder {
		return
	}
	base := o.base + uint32(len(o.ids)) // past every number in use
	kept := 0
	for i := o.head; i < len(o.ids); i++ {
		id := o.ids[i]
		b, ok := blocks[id]
		if !ok || b.seq != o.base+uint32(i) {
			continue
		}
		b.seq = base + uint32(kept)
		blocks[id] = b
		o.ids[kept] = id
		kept++
	}
	o.ids, o.head, o.base = o.ids[:kept], 0, base
	if cap(o.ids) > 4*(kept+minOrder) {
		o.ids = slices.Clip(slices.Clone(o.ids))
	}
}
