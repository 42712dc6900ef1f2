package server

import (
	"context"
	"sync"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// exchangeCache keeps the pairs' last exchanges (registry.ExchangeStore)
// for the pairs API, which answers from the snapshot and must not wait on
// the store: an answer that finds them older than exchangeMaxAge starts a
// refresh in the background and goes out with what is there. Only the
// first answer waits, for the first read, and at most exchangeFirstWait.
type exchangeCache struct {
	store registry.ExchangeStore

	mu      sync.Mutex
	m       map[[2]string]time.Time // (prefill ID, decode ID) -> last exchange; never written once published
	at      time.Time               // when m was read; zero before the first read
	loading chan struct{}           // closed when the read under way ends; nil when none is
	waited  bool                    // an answer waited for the first read: no other does
}

const (
	exchangeMaxAge    = time.Second
	exchangeFirstWait = time.Second
	exchangeReadLimit = 5 * time.Second
)

// get returns the last exchanges, as recent as the cache allows.
func (c *exchangeCache) get(ctx context.Context) map[[2]string]time.Time {
	c.mu.Lock()
	if c.loading == nil && time.Since(c.at) > exchangeMaxAge {
		c.loading = make(chan struct{})
		go c.refresh(c.loading)
	}
	m, loading := c.m, c.loading
	first := c.at.IsZero() && !c.waited
	c.waited = true
	c.mu.Unlock()
	if !first || loading == nil {
		return m
	}
	t := time.NewTimer(exchangeFirstWait)
	defer t.Stop()
	select {
	case <-loading:
	case <-t.C:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m
}

// refresh reads the exchanges and publishes them; a failed read keeps the
// last ones, and the next answer tries again.
func (c *exchangeCache) refresh(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), exchangeReadLimit)
	xs, err := c.store.Exchanges(ctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	defer close(done)
	c.loading = nil
	if err != nil {
		return
	}
	m := make(map[[2]string]time.Time, len(xs))
	for _, x := range xs {
		m[[2]string{x.PrefillID, x.DecodeID}] = x.At
	}
	c.m, c.at = m, time.Now()
}
