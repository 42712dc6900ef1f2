package registrytest

import (
	"sync/atomic"
	"time"
)

// Clock is a clock that tests move by hand, for stores and sweepers whose
// Now is configurable. It starts at the real time, so PostgreSQL timestamps
// stay plausible.
type Clock struct{ off atomic.Int64 }

// Now is the clock's time: the real time plus every Advance so far.
func (c *Clock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.off.Add(int64(d)) }
