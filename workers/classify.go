package workers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrCancelled is the cause of a task's context when `gantry task cancel`
// cancelled it.
var ErrCancelled = errors.New("task cancelled")

// ErrTimeout is the cause of a task's context when its attempt ran out of
// time.
var ErrTimeout = errors.New("task timed out")

// ErrLost is the cause of a task's context when the lease on its
// resource was lost while it ran.
var ErrLost = errors.New("resource lease lost")

// errInterrupted is the cause of a task's context when the worker stops.
var errInterrupted = errors.New("worker stopping")

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Permanent() bool { return true }

// Permanent marks err as a permanent failure: the task goes to
// NEEDS_REVIEW at once, whatever attempts it has left. Any error with a
// Permanent() bool method returning true counts the same.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type delayError struct {
	err error
	d   time.Duration
}

func (e *delayError) Error() string             { return e.err.Error() }
func (e *delayError) Unwrap() error             { return e.err }
func (e *delayError) RetryAfter() time.Duration { return e.d }

// RetryAfter marks err as a delayed failure: the task is retried after d
// without using up an attempt (up to Config.MaxDelays times). Any error with
// a RetryAfter() time.Duration method counts the same.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &delayError{err: err, d: d}
}

// class is what becomes of a failed attempt.
type class int

const (
	classRetry class = iota
	classDelay
	classPermanent
	classCancelled
	classInterrupted
)

func (c class) String() string {
	switch c {
	case classDelay:
		return "delay"
	case classPermanent:
		return "permanent"
	case classCancelled:
		return "cancelled"
	case classInterrupted:
		return "interrupted"
	}
	return "retry"
}

// classify sorts a handler's error; the delay is set for classDelay.
func classify(err error) (class, time.Duration) {
	switch {
	case errors.Is(err, ErrCancelled):
		return classCancelled, 0
	case errors.Is(err, errInterrupted):
		return classInterrupted, 0
	}
	var p interface{ Permanent() bool }
	if errors.As(err, &p) && p.Permanent() {
		return classPermanent, 0
	}
	var d interface{ RetryAfter() time.Duration }
	if errors.As(err, &d) {
		return classDelay, max(d.RetryAfter(), 0)
	}
	return classRetry, 0
}

// backoff is the delay before the retry that follows attempt n (n ≥ 1):
// min(base·2^(n-1), max), times a jitter factor in [0.8, 1.2), never above
// max. jitter returns a number in [0, 1).
func backoff(p Policy, n int, jitter func() float64) time.Duration {
	d := p.BackoffBase
	for i := 1; i < n && d < p.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, p.BackoffMax)
	d = time.Duration(float64(d) * (0.8 + 0.4*jitter()))
	return min(d, p.BackoffMax)
}

// jitter is the production jitter source.
func jitter() float64 { return rand.Float64() }

// permanentf is Permanent(fmt.Errorf(format, args...)).
func permanentf(format string, args ...any) error { return Permanent(fmt.Errorf(format, args...)) }
