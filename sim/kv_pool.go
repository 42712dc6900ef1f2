package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// kvPool is the simulator's KV cache: one host buffer mapped off the Go
// heap, cut into regions (the K buffer of every layer, then the V buffer of
// every layer, as SGLang lays out an MHA pool), each holding pages of
// pageSize token slots. Page p of a request lives at the same page index in
// every region. Allocation is safe for concurrent use; the bytes of a page
// belong to whoever allocated it.
type kvPool struct {
	buf      *transfer.HostBuffer
	regions  int
	pages    int
	pageSize int
	slotLen  int
	itemLen  int

	mu   sync.Mutex
	free []int // a stack; the top is the next page handed out
}

func newKVPool(c Config) (*kvPool, error) {
	p := &kvPool{regions: c.regions(), pages: c.Pages, pageSize: c.PageSize, slotLen: c.slotLen(), itemLen: c.itemLen()}
	buf, err := transfer.AllocHost(int(c.poolBytes()))
	if err != nil {
		return nil, fmt.Errorf("allocate KV pool: %w", err)
	}
	p.buf = buf
	p.free = make([]int, p.pages)
	for i := range p.free {
		p.free[i] = p.pages - 1 - i // hand out low pages first
	}
	return p, nil
}

// pagesFor is the number of pages n tokens occupy.
func (p *kvPool) pagesFor(n int) int { return (n + p.pageSize - 1) / p.pageSize }

// alloc takes n pages, or none when fewer are free.
func (p *kvPool) alloc(n int) ([]int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > len(p.free) {
		return nil, false
	}
	out := make([]int, n)
	for i := range out {
		out[i] = p.free[len(p.free)-1-i]
	}
	p.free = p.free[:len(p.free)-n]
	return out, true
}

// release gives pages back.
func (p *kvPool) release(pages []int) {
	if len(pages) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(pages) - 1; i >= 0; i-- {
		p.free = append(p.free, pages[i])
	}
}

// usage is the fraction of pages in use.
func (p *kvPool) usage() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(p.pages-len(p.free)) / float64(p.pages)
}

// regionLen is the bytes of one region.
func (p *kvPool) regionLen() int { return p.pages * p.itemLen }

// item returns page page of region r.
func (p *kvPool) item(r, page int) []byte {
	off := r*p.regionLen() + page*p.itemLen
	return p.buf.Bytes()[off : off+p.itemLen]
}

// geometry is the pool as a transfer rank: one DRAM region per K/V layer
// buffer, one item per page.
func (p *kvPool) geometry(agent string) transfer.RankGeometry {
	g := transfer.RankGeometry{AgentName: agent}
	base := p.buf.Addr()
	for r := range p.regions {
		g.KVDataPtrs = append(g.KVDataPtrs, base+uint64(r*p.regionLen()))
		g.KVDataLens = append(g.KVDataLens, uint64(p.regionLen()))
		g.KVItemLens = append(g.KVItemLens, uint64(p.itemLen))
		g.KVMemKinds = append(g.KVMemKinds, registry.DRAM)
	}
	return g
}

// free unmaps the pool; every backend must have deregistered it.
func (p *kvPool) close() error { return p.buf.Free() }

// The KV bytes a prefill "computes" are a pure function of the prompt, the
// region and the position: the slot of position i in region r is a
// pseudo-random stream seeded by the hash of tokens[0..i] (so that, as in a
// real model, a position's KV depends on the prefix up to it) and r. Slots
// past the end of the prompt in the last page are zero.

// promptSeeds returns the prefix hash of every position.
func promptSeeds(tokens []int) []uint64 {
	seeds := make([]uint64, len(tokens))
	h := uint64(0xcbf29ce484222325)
	for i, t := range tokens {
		h = mix64(h ^ uint64(t) ^ uint64(i)<<40)
		seeds[i] = h
	}
	return seeds
}

// mix64 is splitmix64's finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// slotPattern writes the bytes of one slot (or zeros past the prompt).
func slotPattern(b []byte, seeds []uint64, pos, region int) {
	if pos >= len(seeds) {
		clear(b)
		return
	}
	v := seeds[pos] ^ uint64(region+1)*0x9e3779b97f4a7c15
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v = v*6364136223846793005 + 1442695040888963407
		binary.LittleEndian.PutUint64(b[i:], v^v>>29)
	}
	for ; i < len(b); i++ {
		v = v*6364136223846793005 + 1442695040888963407
		b[i] = byte(v >> 56)
	}
}

// fill writes the prompt's KV into pages (pages[j] holds positions
// j*pageSize ...) of every region.
func (p *kvPool) fill(seeds []uint64, pages []int) {
	for r := range p.regions {
		for j, pg := range pages {
			it := p.item(r, pg)
			for s := range p.pageSize {
				slotPattern(it[s*p.slotLen:(s+1)*p.slotLen], seeds, j*p.pageSize+s, r)
			}
		}
	}
}

// verify checks that pages hold the prompt's KV and names the first slot
// that does not.
func (p *kvPool) verify(seeds []uint64, pages []int) error {
	want := make([]byte, p.slotLen)
	for r := range p.regions {
		for j, pg := range pages {
			it := p.item(r, pg)
			for s := range p.pageSize {
				slotPattern(want, seeds, j*p.pageSize+s, r)
				got := it[s*p.slotLen : (s+1)*p.slotLen]
				if !bytes.Equal(got, want) {
					return fmt.Errorf("region %d, page %d (pool page %d), slot %d (position %d) does not hold the prompt's KV", r, j, pg, s, j*p.pageSize+s)
				}
			}
		}
	}
	return nil
}

// poison fills pages with a pattern no prompt produces, so that a transfer
// that never happened cannot pass for one that did.
func (p *kvPool) poison(pages []int) {
	for r := range p.regions {
		for _, pg := range pages {
			it := p.item(r, pg)
			for i := range it {
				it[i] = 0xA5
			}
		}
	}
}

// corrupt flips one byte of the first slot of every page in region 0: the
// "corrupt-kv" fault.
func (p *kvPool) corrupt(pages []int) {
	for _, pg := range pages {
		p.item(0, pg)[0] ^= 0xFF
	}
}
