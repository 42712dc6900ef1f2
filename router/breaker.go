package router

import (
	"sync"
	"sync/atomic"
	"time"
)

// breakerState is where a circuit breaker is.
type breakerState int32

// Breaker states; the numbers are the values of the breaker-state gauge.
const (
	breakerClosed   breakerState = 0 // requests flow
	breakerOpen     breakerState = 1 // requests are refused until the cool-down ends
	breakerHalfOpen breakerState = 2 // one probe request is let through
)

func (s breakerState) String() string {
	switch s {
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half_open"
	default:
		return "closed"
	}
}

// breaker is a consecutive-failure circuit breaker: closed → open after
// threshold consecutive failures → half-open once the cool-down has passed,
// letting one probe through → closed when the probe succeeds, open again
// when it fails. The closed path costs one atomic load.
type breaker struct {
	state    atomic.Int32 // breakerState
	failures atomic.Int32 // consecutive failures while closed

	mu       sync.Mutex
	openedAt time.Time
	probing  bool

	onChange func(from, to breakerState) // called with mu held; may be nil
}

// acquire reports whether a request may use the peer or pair now, and
// whether it is the half-open probe (which must be settled with success,
// failure or release).
func (b *breaker) acquire(now time.Time, cooldown time.Duration) (ok, probe bool) {
	if breakerState(b.state.Load()) == breakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch breakerState(b.state.Load()) {
	case breakerClosed:
		return true, false
	case breakerOpen:
		if now.Sub(b.openedAt) < cooldown {
			return false, false
		}
		b.setLocked(breakerHalfOpen)
		b.probing = true
		return true, true
	default: // half-open
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
}

// available reports, without taking the probe, whether acquire could
// succeed now.
func (b *breaker) available(now time.Time, cooldown time.Duration) bool {
	if breakerState(b.state.Load()) == breakerClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch breakerState(b.state.Load()) {
	case breakerOpen:
		return now.Sub(b.openedAt) >= cooldown
	case breakerHalfOpen:
		return !b.probing
	}
	return true
}

// success records a request that worked.
func (b *breaker) success(probe bool) {
	if !probe && breakerState(b.state.Load()) == breakerClosed {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe || breakerState(b.state.Load()) == breakerClosed {
		b.probing = false
		b.failures.Store(0)
		b.setLocked(breakerClosed)
	}
}

// failure records a request that failed; it reports whether the breaker
// opened because of it.
func (b *breaker) failure(probe bool, threshold int, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe:
		b.probing = false
		b.openedAt = now
		b.setLocked(breakerOpen)
		return true
	case breakerState(b.state.Load()) == breakerClosed:
		if int(b.failures.Add(1)) >= threshold {
			b.openedAt = now
			b.setLocked(breakerOpen)
			return true
		}
	}
	return false
}

// release gives back a probe whose request ended without a verdict (the
// client left, or the pair was not used), so that another may probe.
func (b *breaker) release(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// forceOpen opens the breaker at once, for a peer or pair known to fail,
// ending any probe; it reports whether the breaker was not open before.
func (b *breaker) forceOpen(now time.Time) (opened bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.openedAt = now
	opened = breakerState(b.state.Load()) != breakerOpen
	b.setLocked(breakerOpen)
	return opened
}

// reset closes the breaker, for a peer that re-registered.
func (b *breaker) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	b.failures.Store(0)
	b.setLocked(breakerClosed)
}

func (b *breaker) current() breakerState { return breakerState(b.state.Load()) }

func (b *breaker) setLocked(s breakerState) {
	if old := breakerState(b.state.Swap(int32(s))); old != s && b.onChange != nil {
		b.onChange(old, s)
	}
}
