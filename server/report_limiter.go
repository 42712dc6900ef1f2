package server

import (
	"math"
	"sync"
	"time"
)

// reportLimiter bounds how many stale reports about other peers each
// reporter may make: a token bucket per reporter, refilled at rate per
// second up to burst. A peer can report a failing decode as often as its
// transfers fail, but one compromised or confused agent cannot flap the
// whole fleet. Each replica keeps its own buckets.
type reportLimiter struct {
	rate  float64
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxBuckets bounds the limiter's memory; past it, buckets that have
// refilled (and so carry no information) are dropped.
const maxBuckets = 100_000

func newReportLimiter(rate float64, burst int, now func() time.Time) *reportLimiter {
	return &reportLimiter{rate: rate, burst: float64(burst), now: now, buckets: map[string]*bucket{}}
}

// allow takes one token from the reporter's bucket. When it is empty, it
// says how long until the next token.
func (l *reportLimiter) allow(reporter string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.buckets[reporter]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.pruneLocked(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[reporter] = b
	}
	if d := now.Sub(b.at).Seconds(); d > 0 {
		b.tokens = math.Min(l.burst, b.tokens+d*l.rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

func (l *reportLimiter) pruneLocked(now time.Time) {
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}
