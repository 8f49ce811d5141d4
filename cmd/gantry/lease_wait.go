package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/pflag"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/proctree"
)

// waitFlags are `lease acquire|run --wait[=TIMEOUT]`: wait in the
// resource's line, like flock -w, instead of exiting 3 at once.
// --wait-timeout D is --wait=D, as `gantry submit` spells it.
type waitFlags struct {
	wait    waitValue
	timeout time.Duration
}

// waitValue is the value of --wait: set or not, and its timeout (0: none).
type waitValue struct {
	on      bool
	timeout time.Duration
}

// waitForever is --wait without a value.
const waitForever = "forever"

func (v *waitValue) String() string {
	switch {
	case !v.on:
		return ""
	case v.timeout == 0:
		return waitForever
	}
	return v.timeout.String()
}

func (v *waitValue) Set(s string) error {
	if s == waitForever {
		v.on, v.timeout = true, 0
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 30s, or nothing to wait as long as it takes")
	}
	v.on, v.timeout = true, d
	return nil
}

func (v *waitValue) Type() string { return "duration" }

func (f *waitFlags) register(fs *pflag.FlagSet) {
	fs.Var(&f.wait, "wait", "if RES is held (or cooling down, DISABLED, FAULT), wait in its line for it, up to `TIMEOUT` (--wait=30s), then exit 3")
	fs.Lookup("wait").NoOptDefVal = waitForever
	fs.DurationVar(&f.timeout, "wait-timeout", 0, "same as --wait=TIMEOUT")
}

// on reports whether a wait was asked for, and for how long (0: no limit).
func (f *waitFlags) on() (bool, time.Duration) {
	if f.timeout > 0 {
		return true, f.timeout
	}
	return f.wait.on, f.wait.timeout
}

// waitInLine returns what a lease call needs to wait as f asks: the
// context to call with, which ends on SIGINT or SIGTERM while the wait
// lasts (the place in line is then given up at once, not after its TTL),
// the client's options, which say on stderr who holds the resource, until
// when, and where the wait stands each time that changes, and a function
// to call once the call has returned. Without --wait it changes nothing.
func (a *app) waitInLine(ctx context.Context, f *waitFlags) (context.Context, []client.LeaseOption, func()) {
	on, timeout := f.on()
	if !on {
		return ctx, nil, func() {}
	}
	var last string
	printer := func(s client.WaitStatus) {
		if s.Holder == "" && s.State != wire.ResourceDisabled && s.State != wire.ResourceFault {
			return // free: being taken now
		}
		// The holder's renewals move its expiry on: not news by itself.
		same := s
		same.Until = time.Time{}
		if news := same.String(); news != last {
			last = news
			fmt.Fprintf(a.stderr, "gantry: waiting for %s: %v\n", s.Resource, s)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, proctree.Interrupts()...)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case s := <-sigs:
			cancel(fmt.Errorf("%w by %v", errWaitInterrupted, s))
		case <-done:
		}
	}()
	opts := []client.LeaseOption{client.WaitInLine(timeout), client.OnWait(printer)}
	return ctx, opts, func() {
		signal.Stop(sigs)
		close(done)
		<-stopped
	}
}

// errWaitInterrupted is why a --wait stopped on a signal.
var errWaitInterrupted = errors.New("interrupted")
