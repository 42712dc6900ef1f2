package replica

import (
	"context"
	"sync"

	"github.com/pdplane/pdplane/registry"
)

// Broadcaster fans Changes out to subscribers. A slow subscriber never blocks
// the publisher: its pending changes are merged until it reads them.
// Stores use it to implement Subscribe.
type Broadcaster struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	mu      sync.Mutex
	ids     map[string]struct{}
	stale   map[string]int64 // hinted stale: the latest generation of each
	all     bool
	pending bool
	wake    chan struct{}
}

// Publish announces a change to every subscriber.
func (b *Broadcaster) Publish(c registry.Change) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		s.mu.Lock()
		if c.ReloadAll() {
			s.all = true
		}
		for _, id := range c.PeerIDs {
			s.ids[id] = struct{}{}
		}
		for _, h := range c.Stale {
			if g, ok := s.stale[h.ID]; !ok || h.Generation > g {
				s.stale[h.ID] = h.Generation
			}
		}
		s.pending = true
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// Subscribe returns a channel of merged changes that closes when ctx ends.
func (b *Broadcaster) Subscribe(ctx context.Context) <-chan registry.Change {
	s := &subscriber{ids: map[string]struct{}{}, stale: map[string]int64{}, wake: make(chan struct{}, 1)}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = map[*subscriber]struct{}{}
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	out := make(chan registry.Change)
	go func() {
		defer close(out)
		defer func() {
			b.mu.Lock()
			delete(b.subs, s)
			b.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			}
			s.mu.Lock()
			if !s.pending {
				s.mu.Unlock()
				continue
			}
			var c registry.Change
			// A reload of everything carries no hints: a Change with
			// hints is not a reload, and the reload reads every peer
			// anyway.
			if !s.all {
				c.PeerIDs = make([]string, 0, len(s.ids))
				for id := range s.ids {
					c.PeerIDs = append(c.PeerIDs, id)
				}
				for id, g := range s.stale {
					c.Stale = append(c.Stale, registry.StaleHint{ID: id, Generation: g})
				}
			}
			clear(s.ids)
			clear(s.stale)
			s.all, s.pending = false, false
			s.mu.Unlock()
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
