package clock

import (
	"testing"
	"time"
)

func TestFakeFiresInOrder(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := NewFake(start)
	a := f.NewTimer(2 * time.Second)
	b := f.NewTimer(time.Second)
	stopped := f.NewTimer(time.Second)
	if !stopped.Stop() {
		t.Errorf("Stop = false, want true for an armed timer")
	}
	f.Advance(1500 * time.Millisecond)
	select {
	case got := <-b.C():
		if want := start.Add(time.Second); !got.Equal(want) {
			t.Errorf("b fired at %v, want %v", got, want)
		}
	default:
		t.Fatal("b did not fire after 1.5s")
	}
	select {
	case <-a.C():
		t.Fatal("a fired early")
	case <-stopped.C():
		t.Fatal("stopped timer fired")
	default:
	}
	if !a.Reset(time.Second) {
		t.Errorf("Reset = false, want true for an armed timer")
	}
	f.Advance(time.Second)
	select {
	case <-a.C():
	default:
		t.Fatal("a did not fire after reset")
	}
	if got, want := f.Now(), start.Add(2500*time.Millisecond); !got.Equal(want) {
		t.Errorf("Now = %v, want %v", got, want)
	}
	if got := f.Timers(); got != 0 {
		t.Errorf("Timers = %d, want 0", got)
	}
}

// TestFakeJump: a jump of the wall clock, either way, moves Now and leaves
// each timer the time it had left.
func TestFakeJump(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, d := range []time.Duration{time.Hour, -time.Hour} {
		f := NewFake(start)
		tm := f.NewTimer(10 * time.Second)
		f.Jump(d)
		if got, want := f.Now(), start.Add(d); !got.Equal(want) {
			t.Errorf("Jump(%v): Now = %v, want %v", d, got, want)
		}
		f.Advance(9 * time.Second)
		select {
		case <-tm.C():
			t.Fatalf("Jump(%v): the timer fired 9s after it was armed, want 10s", d)
		default:
		}
		f.Advance(time.Second)
		select {
		case got := <-tm.C():
			if want := start.Add(d + 10*time.Second); !got.Equal(want) {
				t.Errorf("Jump(%v): fired at %v, want %v", d, got, want)
			}
		default:
			t.Fatalf("Jump(%v): the timer did not fire 10s after it was armed", d)
		}
	}
}

func TestRound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want time.Duration }{
		{3*time.Minute + 59953555092*time.Nanosecond, 4 * time.Minute},
		{1234567 * time.Microsecond, 1200 * time.Millisecond},
		{30 * time.Second, 30 * time.Second},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{250 * time.Nanosecond, 250 * time.Nanosecond},
		{-90500 * time.Millisecond, -91 * time.Second},
	} {
		if got := Round(tc.in); got != tc.want {
			t.Errorf("Round(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
