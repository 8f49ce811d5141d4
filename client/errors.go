package client

import (
	"errors"

	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
)

// The errors a caller tests with errors.Is. They are gantry's one error
// vocabulary (package kv): an error from a store on this machine and one a
// service answered from another machine match the same entries.
var (
	// ErrNotFound: no such task, lease, resource, job, run or route.
	ErrNotFound = kv.ErrNotFound
	// ErrInvalid: bad input (an id, a type, a payload, a state to move to,
	// a job definition, a task in a state the call does not apply to),
	// refused before anything was written.
	ErrInvalid = kv.ErrInvalid
	// ErrExists: a task id is taken.
	ErrExists = kv.ErrExists
	// ErrChanged: what the call read changed before it could write; try
	// again.
	ErrChanged = kv.ErrChanged
	// ErrConflict: held or run by someone else: a lease of another owner
	// (a *ConflictError names it), a job whose unfinished run forbids
	// another.
	ErrConflict = kv.ErrConflict
	// ErrUnavailable: no service answers (auditd, healthd, the leading
	// scheduler), a store failed, a resource is DISABLED or FAULT.
	ErrUnavailable = kv.ErrUnavailable
	// ErrLeaseLost: the lease a holder names lapsed, was released or is
	// held by someone else now.
	ErrLeaseLost = lease.ErrLost
	// ErrIllegalMove: the resource state machine does not allow the move
	// (an *IllegalMoveError names from and to).
	ErrIllegalMove = lease.ErrIllegalMove
	// ErrGaveUp: Wait's context ended before the task did; the task may
	// still finish.
	ErrGaveUp = errors.New("gave up waiting for the task")
	// ErrMalformedEvent: TailAudit met a message on the audit stream that
	// is not an event; the tail goes on.
	ErrMalformedEvent = errors.New("malformed audit event")
)

// ConflictError names the owner holding a lease and its expiry.
type ConflictError = lease.ConflictError

// IllegalMoveError names a refused resource move.
type IllegalMoveError = lease.IllegalMoveError

// UnavailableError names a resource that cannot be leased in its state.
type UnavailableError = lease.UnavailableError

// WaitError reports a lease wait in line (WaitInLine) that ended first; it
// matches ErrConflict when the wait ran out of time, and names what held it
// up.
type WaitError = lease.WaitError

// ServiceError is a failure answer of a service, with its status code
// (400, 404, 409, 503, 500; see docs/protocol.md).
type ServiceError = rpc.Error
