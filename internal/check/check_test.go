package check_test

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestUntilReturnsOnceTrue(t *testing.T) {
	t.Parallel()
	calls := 0
	err := check.Until(time.Minute, time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("Until = %v after %d calls, want nil after 3", err, calls)
	}
}

func TestUntilGivesTheLastError(t *testing.T) {
	t.Parallel()
	start := time.Now()
	want := errors.New("never")
	err := check.Until(50*time.Millisecond, 10*time.Millisecond, func() error { return want })
	if !errors.Is(err, want) {
		t.Errorf("Until = %v, want %v", err, want)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("Until returned after %v, want at least the total 50ms", took)
	}
}

func TestForFailsTheTest(t *testing.T) {
	t.Parallel()
	ft := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check.For(ft, 20*time.Millisecond, 5*time.Millisecond, func() error { return errors.New("not yet") })
	}()
	<-done
	if !ft.failed {
		t.Error("For with a condition that never holds did not fail the test")
	}
}

// fakeT records a Fatalf instead of stopping the real test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(string, ...any) {
	f.failed = true
	runtime.Goexit()
}

func TestThatWaitsForTheCondition(t *testing.T) {
	t.Parallel()
	calls := 0
	check.That(t, time.Minute, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Errorf("That returned after %d calls, want 3", calls)
	}
	ft := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check.That(ft, 30*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if !ft.failed {
		t.Error("That with a condition that never holds did not fail the test")
	}
}
