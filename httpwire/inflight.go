package httpwire

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
)

// InFlight counts the requests a handler is answering, and tells when
// none is: what a graceful shutdown waits for. Counting is one atomic add
// a request; the lock is taken only when the count reaches zero while
// someone waits.
type InFlight struct {
	n       atomic.Int64
	waiters atomic.Int64 // Waits under way; counted before they look at n
	mu      sync.Mutex
	idle    []chan struct{} // the Waits', closed when n reaches 0
}

// Handler counts the requests of h.
func (f *InFlight) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.Add(1)
		defer f.Add(-1)
		h.ServeHTTP(w, r)
	})
}

// Add counts d more requests in flight (d < 0: fewer).
func (f *InFlight) Add(d int64) {
	if f.n.Add(d) == 0 && f.waiters.Load() > 0 {
		f.mu.Lock()
		for _, c := range f.idle {
			close(c)
		}
		f.idle = nil
		f.mu.Unlock()
	}
}

// Count is the number of requests in flight.
func (f *InFlight) Count() int64 { return f.n.Load() }

// Wait waits until no request is in flight, or ctx ends (false).
func (f *InFlight) Wait(ctx context.Context) bool {
	// Counted as a waiter first, then registered, then n looked at: an
	// Add that takes n to 0 after that look sees the waiter and wakes it.
	f.waiters.Add(1)
	defer f.waiters.Add(-1)
	c := make(chan struct{})
	f.mu.Lock()
	f.idle = append(f.idle, c)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if i := slices.Index(f.idle, c); i >= 0 {
			f.idle = slices.Delete(f.idle, i, i+1)
		}
		f.mu.Unlock()
	}()
	if f.n.Load() == 0 {
		return true
	}
	select {
	case <-c:
		return true
	case <-ctx.Done():
		return false
	}
}
