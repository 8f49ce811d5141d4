// Package check holds the one polling helper of gantry's tests, in the
// manner of nats-server's checkFor: wait for a condition with a deadline
// instead of sleeping.
package check

import (
	"errors"
	"testing"
	"time"
)

// For calls f every poll until it returns nil, and fails the test with f's
// last error if that has not happened within total. It returns at once when
// f first returns nil.
func For(t testing.TB, total, poll time.Duration, f func() error) {
	t.Helper()
	if err := Until(total, poll, f); err != nil {
		t.Fatalf("after %v: %v", total, err)
	}
}

// That is For for a condition with nothing to report but what it waits
// for: it polls cond every 20 ms and fails the test naming what if cond has
// not held within total.
func That(t testing.TB, total time.Duration, what string, cond func() bool) {
	t.Helper()
	For(t, total, 20*time.Millisecond, func() error {
		if !cond() {
			return errors.New("still waiting for " + what)
		}
		return nil
	})
}

// Until is For without a test: it returns nil once f does, or f's last
// error when total has passed. For benchmarks and helper processes.
func Until(total, poll time.Duration, f func() error) error {
	deadline := time.Now().Add(total)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		<-timer.C
		err := f()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return err
		}
		timer.Reset(min(poll, time.Until(deadline)))
	}
}
