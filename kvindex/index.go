package kvindex

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Index is the router's index of the engines' KV blocks: an Engine for
// each peer that publishes its KV events, each fed by its own events only.
type Index struct {
	cfg     Config
	mu      sync.Mutex // serialises Add and Remove
	engines atomic.Pointer[map[string]*Engine]
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	x := &Index{cfg: cfg}
	x.engines.Store(&map[string]*Engine{})
	return x, nil
}

// Add returns the peer's engine index, a new empty one if the index had
// none. It stays the peer's until Remove (Reset empties it in place), so a
// caller may keep it rather than look it up on every pick.
func (x *Index) Add(peer string) *Engine {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.engines.Load()
	if e, ok := old[peer]; ok {
		return e
	}
	e := newEngine(x.cfg)
	m := maps.Clone(old)
	m[peer] = e
	x.engines.Store(&m)
	return e
}

// Get returns the peer's engine index, or nil.
func (x *Index) Get(peer string) *Engine {
	return (*x.engines.Load())[peer]
}

// Remove drops the peer's engine index. An Apply still running on it
// finishes on an index no one reads.
func (x *Index) Remove(peer string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.engines.Load()
	if _, ok := old[peer]; !ok {
		return
	}
	m := maps.Clone(old)
	delete(m, peer)
	x.engines.Store(&m)
}

// Score appends to dst[:0], for each of peers, how many of keys (one
// request's, from Keys) from the first its engine holds, 0 for a peer the
// index does not know, and returns it. It looks up each matched key once,
// and one more per peer; finding each peer's engine by its ID costs more
// than that at 1,000 peers (BENCHMARKS.md).
func (x *Index) Score(dst []int, keys []uint64, peers []string) []int {
	dst = dst[:0]
	engines := *x.engines.Load()
	for _, p := range peers {
		n := 0
		if e := engines[p]; e != nil {
			n = e.Match(keys)
		}
		dst = append(dst, n)
	}
	return dst
}
