// Package lifecycletest checks that an actor keeps the lifecycle contract
// when it is misused: each component's tests call Misuse with a constructor,
// and FailedStart with an actor whose start fails, instead of writing the
// same cases six times.
package lifecycletest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// Actor is the contract checked: Run, Stop and Ready as lifecycle.Base and
// lifecycle.Run give them.
type Actor interface {
	Run(ctx context.Context) error
	Stop()
	Ready() <-chan struct{}
}

// Timeout bounds every wait of the checks: for readiness, and for Run to
// return after a stop.
const Timeout = 30 * time.Second

// Misuse runs the misuse table against actors made by newActor, a fresh one
// per case, the cases in parallel: Stop before Run, Stop while Run starts,
// Stop twice, Stop after Run returned, Run twice, Run after a stopped Run,
// and a cancelled context. Every Run must return nil, except a second one,
// which must return lifecycle.ErrAlreadyRun at once; nothing may panic or
// hang.
func Misuse(t *testing.T, newActor func(t testing.TB) Actor) {
	t.Helper()
	cases := []struct {
		name string
		test func(t *testing.T, a Actor)
	}{
		{"stop before run", func(t *testing.T, a Actor) {
			a.Stop()
			if err := call(t, "Run after Stop", func() error { return a.Run(context.Background()) }); err != nil {
				t.Errorf("Run after Stop = %v, want nil", err)
			}
			select {
			case <-a.Ready():
				t.Error("Ready closed by a Run after Stop, want it open: nothing started")
			default:
			}
		}},
		{"stop while starting", func(t *testing.T, a Actor) {
			start(context.Background(), a).stop(t, a)
		}},
		{"stop twice", func(t *testing.T, a Actor) {
			r := running(context.Background(), t, a)
			a.Stop()
			r.stop(t, a)
		}},
		{"stop after run returned", func(t *testing.T, a Actor) {
			running(context.Background(), t, a).stop(t, a)
			a.Stop()
			a.Stop()
		}},
		{"run twice", func(t *testing.T, a Actor) {
			r := running(context.Background(), t, a)
			alreadyRun(t, "second Run", a)
			select {
			case err := <-r.done:
				t.Errorf("first Run = %v after a second Run, want it running", err)
				return
			default:
			}
			r.stop(t, a)
		}},
		{"run after stop", func(t *testing.T, a Actor) {
			running(context.Background(), t, a).stop(t, a)
			alreadyRun(t, "Run after a stopped Run", a)
		}},
		{"cancel", func(t *testing.T, a Actor) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := running(ctx, t, a)
			cancel()
			r.stopped(t)
			a.Stop()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t, newActor(t))
		})
	}
}

// FailedStart checks an actor whose start fails: Run returns an error
// (which FailedStart returns, for the caller to check further) without
// closing Ready, Stop afterwards is safe, twice, and a second Run returns
// lifecycle.ErrAlreadyRun.
func FailedStart(t *testing.T, a Actor) error {
	t.Helper()
	err := call(t, "Run", func() error { return a.Run(context.Background()) })
	if err == nil {
		t.Fatal("Run = nil, want the error of the failed start")
	}
	t.Logf("failed start: Run = %v", err)
	select {
	case <-a.Ready():
		t.Error("Ready closed by a failed start, want it open")
	default:
	}
	a.Stop()
	a.Stop()
	alreadyRun(t, "Run after a failed Run", a)
	return err
}

// run is a Run in the background.
type run struct{ done chan error }

func start(ctx context.Context, a Actor) *run {
	r := &run{done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	return r
}

// running starts a Run of a in the background and waits for a to be ready.
func running(ctx context.Context, t *testing.T, a Actor) *run {
	t.Helper()
	r := start(ctx, a)
	r.ready(t, a)
	return r
}

// alreadyRun checks that another Run of a, named what, returns
// lifecycle.ErrAlreadyRun.
func alreadyRun(t *testing.T, what string, a Actor) {
	t.Helper()
	if err := call(t, what, func() error { return a.Run(context.Background()) }); !errors.Is(err, lifecycle.ErrAlreadyRun) {
		t.Errorf("%s = %v, want %v", what, err, lifecycle.ErrAlreadyRun)
	}
}

// stop stops a and waits for its Run to return nil.
func (r *run) stop(t *testing.T, a Actor) {
	t.Helper()
	a.Stop()
	r.stopped(t)
}

// ready waits for a to be ready.
func (r *run) ready(t *testing.T, a Actor) {
	t.Helper()
	select {
	case <-a.Ready():
	case err := <-r.done:
		t.Fatalf("Run = %v before Ready, want it ready", err)
	case <-time.After(Timeout):
		t.Fatalf("Ready not closed within %v", Timeout)
	}
}

// stopped waits for Run to return nil.
func (r *run) stopped(t *testing.T) {
	t.Helper()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(Timeout):
		t.Fatalf("Run did not return within %v of the stop", Timeout)
	}
}

// call runs f, failing t if it does not return within Timeout.
func call(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(Timeout):
		t.Fatalf("%s did not return within %v", what, Timeout)
		return nil
	}
}
