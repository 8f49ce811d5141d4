package lifecycle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/internal/lifecycle"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// toy is an actor on Base: its body starts helpers goroutines with Go,
// each running until the body's context ends, then fails with fail, or
// marks itself ready and waits for Stopping or its context.
type toy struct {
	lifecycle.Base
	helpers int
	fail    error

	bodies  atomic.Int32
	running atomic.Int32
	runner  atomic.Pointer[lifecycle.Runner]
}

func (a *toy) Run(ctx context.Context) error { return lifecycle.Run(ctx, &a.Base, a.run) }

func (a *toy) run(ctx context.Context, r *lifecycle.Runner) error {
	a.bodies.Add(1)
	a.runner.Store(r)
	for range a.helpers {
		a.running.Add(1)
		r.Go(func() {
			defer a.running.Add(-1)
			<-ctx.Done()
		})
	}
	if a.fail != nil {
		return a.fail
	}
	r.MarkReady()
	r.MarkReady()
	select {
	case <-r.Stopping():
	case <-ctx.Done():
	}
	return nil
}

var errStart = errors.New("start failed")

func TestRun(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		fail      error
		stopFirst bool
		cancel    bool
		wantErr   error
		bodies    int32
		ready     bool
	}{
		{name: "clean stop", bodies: 1, ready: true},
		{name: "hard stop", cancel: true, bodies: 1, ready: true},
		{name: "stop before run", stopFirst: true, bodies: 0},
		{name: "failed start", fail: errStart, wantErr: errStart, bodies: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := &toy{helpers: 3, fail: c.fail}
			ready := a.Ready()
			if c.stopFirst {
				a.Stop()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			if c.ready {
				select {
				case <-ready:
				case err := <-done:
					t.Fatalf("Run = %v before Ready", err)
				}
				if c.cancel {
					cancel()
				} else {
					a.Stop()
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return within 5s")
			}
			if !errors.Is(err, c.wantErr) || (err == nil) != (c.wantErr == nil) {
				t.Errorf("Run = %v, want %v", err, c.wantErr)
			}
			if got := a.bodies.Load(); got != c.bodies {
				t.Errorf("bodies run = %d, want %d", got, c.bodies)
			}
			if got := a.running.Load(); got != 0 {
				t.Errorf("goroutines of Go running after Run returned = %d, want 0", got)
			}
			select {
			case <-ready:
				if !c.ready {
					t.Error("Ready closed, want it open")
				}
			default:
				if c.ready {
					t.Error("Ready open, want it closed")
				}
			}

			// Whatever happened, later calls are safe.
			a.Stop()
			a.Stop()
			if err := a.Run(context.Background()); !errors.Is(err, lifecycle.ErrAlreadyRun) {
				t.Errorf("Run again = %v, want %v", err, lifecycle.ErrAlreadyRun)
			}
			if r := a.runner.Load(); r != nil {
				if r.Go(func() { t.Error("Go ran f after the body returned") }) {
					t.Error("Go after the body returned = true, want false")
				}
				if r.StopContext().Err() == nil {
					t.Error("StopContext not cancelled after Run returned")
				}
			}
			if got := a.bodies.Load(); got != c.bodies {
				t.Errorf("bodies run after a second Run = %d, want %d", got, c.bodies)
			}
		})
	}
}

func TestRunConcurrently(t *testing.T) {
	t.Parallel()
	a := &toy{}
	const n = 8
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { errs <- a.Run(context.Background()) })
	}
	<-a.Ready()
	a.Stop()
	wg.Wait()
	close(errs)
	var clean, twice int
	for err := range errs {
		switch {
		case err == nil:
			clean++
		case errors.Is(err, lifecycle.ErrAlreadyRun):
			twice++
		default:
			t.Errorf("Run = %v, want nil or %v", err, lifecycle.ErrAlreadyRun)
		}
	}
	if clean != 1 || twice != n-1 {
		t.Errorf("Runs returning nil, ErrAlreadyRun = %d, %d, want 1, %d", clean, twice, n-1)
	}
	if got := a.bodies.Load(); got != 1 {
		t.Errorf("bodies run = %d, want 1", got)
	}
}

// TestStopContext: Stop cancels StopContext, the graceful stop of an actor
// that cancels its work, and leaves the body's context, the hard stop,
// alone.
func TestStopContext(t *testing.T) {
	t.Parallel()
	var b lifecycle.Base
	done := make(chan error, 1)
	go func() {
		done <- lifecycle.Run(context.Background(), &b, func(ctx context.Context, r *lifecycle.Runner) error {
			r.MarkReady()
			<-r.StopContext().Done()
			if ctx.Err() != nil {
				return errors.New("body context cancelled by Stop")
			}
			return nil
		})
	}()
	<-b.Ready()
	b.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("StopContext not cancelled by Stop within 5s")
	}
}

func TestMisuse(t *testing.T) {
	t.Parallel()
	lifecycletest.Misuse(t, func(testing.TB) lifecycletest.Actor { return &toy{helpers: 2} })
}

func TestFailedStart(t *testing.T) {
	t.Parallel()
	a := &toy{helpers: 2, fail: errStart}
	if err := lifecycletest.FailedStart(t, a); !errors.Is(err, errStart) {
		t.Errorf("Run = %v, want %v", err, errStart)
	}
	if got := a.running.Load(); got != 0 {
		t.Errorf("goroutines of Go running after a failed start = %d, want 0", got)
	}
}

func TestStop(t *testing.T) {
	t.Parallel()
	var s lifecycle.Stop
	if s.Stopped() {
		t.Fatal("Stopped = true before Stop")
	}
	ctx, cancel := s.Context(context.Background())
	defer cancel()
	s.Stop()
	s.Stop()
	if !s.Stopped() {
		t.Error("Stopped = false after Stop")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not cancelled by Stop")
	}

	// A context made after Stop is cancelled at once; one whose parent ends
	// first releases its goroutine (goleak checks).
	var late lifecycle.Stop
	late.Stop()
	ctx2, cancel2 := late.Context(context.Background())
	defer cancel2()
	select {
	case <-ctx2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context made after Stop not cancelled")
	}
	var never lifecycle.Stop
	parent, cancelParent := context.WithCancel(context.Background())
	ctx3, cancel3 := never.Context(parent)
	defer cancel3()
	cancelParent()
	<-ctx3.Done()
}
