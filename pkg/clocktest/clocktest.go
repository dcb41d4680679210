// Package clocktest is a clock for tests of what expires: it stands still
// until the test moves it.
package clocktest

import (
	"sync"
	"time"
)

// Clock is a time that moves only by Advance; safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New is a clock at a fixed, arbitrary time.
func New() *Clock { return &Clock{t: time.Unix(1e9, 0)} }

// Now is the clock's time, for a func() time.Time field of the code under
// test.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
