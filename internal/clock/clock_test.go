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
