// Package clock injects time: Real in production, Fake in tests, so that
// scheduling, backoff and cooldown logic can be tested without waiting.
package clock

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
	// After is NewTimer(d).C() without a way to stop it.
	After(d time.Duration) <-chan time.Time
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
	// Reset makes the timer fire after d; it reports whether it was active.
	Reset(d time.Duration) bool
}

// Sleep waits d on c, or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, c Clock, d time.Duration) bool {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// Real is the system clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// After wraps time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// Fake is a manual clock for tests: time moves only by Advance or Set.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFake returns a fake clock reading now.
func NewFake(now time.Time) *Fake { return &Fake{now: now} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches Now()+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	f.schedule(t, d)
	return t
}

// After returns NewTimer(d).C().
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

// Advance moves the fake time forward by d, firing every timer due on the
// way, in order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	f.Set(target)
}

// Set moves the fake time to t (never backwards), firing every timer due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].when.Before(f.timers[j].when) })
		if len(f.timers) == 0 || f.timers[0].when.After(t) {
			break
		}
		next := f.timers[0]
		f.timers = f.timers[1:]
		next.active = false
		if next.when.After(f.now) {
			f.now = next.when
		}
		select {
		case next.c <- f.now:
		default:
		}
	}
	if t.After(f.now) {
		f.now = t
	}
}

// Jump steps the wall clock by d, forward or back, as a user setting the
// clock or an NTP step does: Now moves by d at once, while every timer keeps
// the time it had left (Go's timers run on the monotonic clock) and none
// fires.
func (f *Fake) Jump(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	for _, t := range f.timers {
		t.when = t.when.Add(d)
	}
}

// Timers returns how many timers are waiting: a test can wait for the code
// under test to arm its timer before advancing.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

func (f *Fake) schedule(t *fakeTimer, d time.Duration) {
	t.when = f.now.Add(d)
	t.active = true
	if d <= 0 {
		t.active = false
		select {
		case t.c <- f.now:
		default:
		}
		return
	}
	f.timers = append(f.timers, t)
}

func (f *Fake) remove(t *fakeTimer) bool {
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			return true
		}
	}
	return false
}

type fakeTimer struct {
	f      *Fake
	c      chan time.Time
	when   time.Time
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.active
	t.active = false
	t.f.remove(t)
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.active
	t.f.remove(t)
	t.f.schedule(t, d)
	return was
}

// Round rounds d for a person to read: to the second from a minute up
// ("4m0s", not "3m59.953555092s"), to a tenth of a second from a second
// up, to the millisecond below that.
func Round(d time.Duration) time.Duration {
	switch a := d.Abs(); {
	case a >= time.Minute:
		return d.Round(time.Second)
	case a >= time.Second:
		return d.Round(100 * time.Millisecond)
	case a >= time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d
}
