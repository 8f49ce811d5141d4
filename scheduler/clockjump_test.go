package scheduler

import (
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
)

// TestClockJumps: the wall clock of the scheduler's machine steps an hour
// forward, then an hour back (a user setting it, an NTP step, a laptop
// resumed), while a job fires every 10 s under misfire once. Forward, the
// missed hour is one fire (the latest planned time) and JOB_MISSED events,
// not 360 fires. Back, nothing planned before the last fire runs again and
// nothing spins: the next fire is the first planned time after the last.
func TestClockJumps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "tick", Type: "noop", Every: "10s", Misfire: wire.MisfireOnce})
	b.advance(10 * time.Second)
	if got := b.waitTasks(1); !got[0].planned.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("first task planned %s, want %s", got[0].planned, t0.Add(10*time.Second))
	}

	armed := func() error {
		if b.clk.Timers() == 0 {
			return errors.New("fake clock Timers = 0, want an armed timer")
		}
		return nil
	}
	check.For(t, 15*time.Second, 10*time.Millisecond, armed)
	// The clock reads t0+1h+15s at once; the timer armed for t0+20s fires
	// 10 s after it was armed, at t0+1h+25s.
	b.clk.Jump(time.Hour + 5*time.Second)
	b.advance(10 * time.Second)
	last := t0.Add(time.Hour + 20*time.Second)
	if got := b.waitTasks(2); !got[1].planned.Equal(last) {
		t.Errorf("task after the jump forward planned %s, want the latest missed time %s", got[1].planned, last)
	}
	missed := b.waitEvents(wire.EventJobMissed, maxMissedEvents+1)
	t.Logf("jump forward by 1h: 1 fire, %d JOB_MISSED events", len(missed))

	check.For(t, 15*time.Second, 10*time.Millisecond, armed)
	b.clk.Jump(-time.Hour)
	// The clock reads t0+25s again: an hour and 5 s pass before the next
	// planned time, t0+1h+30s, in steps that fire every timer on the way.
	for range 6 * 60 {
		b.advance(10 * time.Second)
	}
	b.advance(5 * time.Second)
	got := b.waitTasks(3)
	if want := last.Add(10 * time.Second); !got[2].planned.Equal(want) {
		t.Errorf("task after the jump back planned %s, want %s (nothing before the last fire again)", got[2].planned, want)
	}
	if n := len(b.events(wire.EventJobMissed)); n != len(missed) {
		t.Errorf("JOB_MISSED after the jump back = %d more, want none", n-len(missed))
	}
}
