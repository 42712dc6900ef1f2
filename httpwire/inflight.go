package httpwire

import (
	"context"
	"net/http"
	"sync"
)

// InFlight counts the requests a handler is answering, and tells when
// none is: what a graceful shutdown waits for.
type InFlight struct {
	mu   sync.Mutex
	n    int64
	idle chan struct{} // closed while n is 0; nil before the first request
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
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 && d > 0 {
		f.idle = make(chan struct{})
	}
	if f.n += d; f.n == 0 {
		close(f.idle)
	}
}

// Count is the number of requests in flight.
func (f *InFlight) Count() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// Wait waits until no request is in flight, or ctx ends (false).
func (f *InFlight) Wait(ctx context.Context) bool {
	f.mu.Lock()
	idle, n := f.idle, f.n
	f.mu.Unlock()
	if n == 0 {
		return true
	}
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}
