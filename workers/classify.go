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

// Class is what a worker does with the outcome of an attempt.
type Class int

// The classes of an attempt's outcome.
const (
	// ClassSucceeded: the handler returned nil; the task is SUCCEEDED.
	ClassSucceeded Class = iota
	// ClassRetry: a retryable failure; the task is retried after a backoff
	// with jitter, or goes to NEEDS_REVIEW when its attempts are used up.
	ClassRetry
	// ClassDelay: a delayed failure (RetryAfter); the task is retried after
	// the hinted delay without using up an attempt.
	ClassDelay
	// ClassPermanent: a permanent failure (Permanent); the task goes to
	// NEEDS_REVIEW at once.
	ClassPermanent
	// ClassCancelled: the task was cancelled (ErrCancelled); it ends
	// CANCELLED.
	ClassCancelled
	// ClassInterrupted: the worker stopped under the task; it waits for
	// another worker without using up an attempt.
	ClassInterrupted
)

// String is the class's name as audit events carry it.
func (c Class) String() string {
	switch c {
	case ClassSucceeded:
		return "succeeded"
	case ClassDelay:
		return "delay"
	case ClassPermanent:
		return "permanent"
	case ClassCancelled:
		return "cancelled"
	case ClassInterrupted:
		return "interrupted"
	}
	return "retry"
}

// Classify sorts a handler's result the way a worker does; the delay is
// set for ClassDelay (0 there means the queue's default delay).
func Classify(err error) (Class, time.Duration) {
	if err == nil {
		return ClassSucceeded, 0
	}
	switch {
	case errors.Is(err, ErrCancelled):
		return ClassCancelled, 0
	case errors.Is(err, errInterrupted):
		return ClassInterrupted, 0
	}
	var p interface{ Permanent() bool }
	if errors.As(err, &p) && p.Permanent() {
		return ClassPermanent, 0
	}
	var d interface{ RetryAfter() time.Duration }
	if errors.As(err, &d) {
		return ClassDelay, max(d.RetryAfter(), 0)
	}
	return ClassRetry, 0
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
