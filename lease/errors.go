package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// Sentinel errors of the lease and resource stores, checked with errors.Is.
var (
	// ErrConflict means another owner holds the lease; the error is a
	// *ConflictError that names the holder. It matches kv.ErrConflict.
	ErrConflict = kv.Sentinel("lease held by another owner", kv.ErrConflict)
	// ErrNotFound means no such lease or resource. It matches
	// kv.ErrNotFound.
	ErrNotFound = kv.Sentinel("not found", kv.ErrNotFound)
	// ErrLost means the caller no longer holds the lease it names: it
	// lapsed, was released, or is now held by someone else. Nothing was
	// changed.
	ErrLost = errors.New("lease lost")
	// ErrUnavailable means the resource is DISABLED or FAULT and cannot be
	// leased; the error is an *UnavailableError. It matches
	// kv.ErrUnavailable.
	ErrUnavailable = kv.Sentinel("resource unavailable", kv.ErrUnavailable)
	// ErrIllegalMove means a resource state move is not allowed; the error
	// is an *IllegalMoveError naming from and to.
	ErrIllegalMove = errors.New("illegal resource state move")
	// ErrInvalid marks bad input: an id that cannot be a key, a TTL that
	// is not positive, a missing owner or reason, an unknown policy. It is
	// kv.ErrInvalid.
	ErrInvalid = kv.ErrInvalid
)

// ConflictError reports that a lease is held by another owner. It matches
// ErrConflict.
type ConflictError struct {
	Resource string
	// Holder is the owner holding the lease.
	Holder string
	// ExpiresAt is when the holder's lease lapses unless renewed
	// (informative: the broker's TTL decides).
	ExpiresAt time.Time
	// Revision is the holder's lease revision.
	Revision uint64
}

// Error names the resource, the holder and its expiry.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("resource %s is held by %s until %s", e.Resource, e.Holder, e.ExpiresAt.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrConflict) and errors.Is(err, kv.ErrConflict)
// true.
func (e *ConflictError) Is(target error) bool {
	return target == ErrConflict || target == kv.ErrConflict
}

// UnavailableError reports that a resource cannot be leased in its state.
// It matches ErrUnavailable.
type UnavailableError struct {
	Resource  string
	State     wire.ResourceState
	LastError string
}

// Error names the resource and its state.
func (e *UnavailableError) Error() string {
	msg := fmt.Sprintf("resource %s is %s and cannot be leased", e.Resource, e.State)
	if e.LastError != "" {
		msg += " (last error: " + e.LastError + ")"
	}
	return msg
}

// Is makes errors.Is(err, ErrUnavailable) and errors.Is(err,
// kv.ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool {
	return target == ErrUnavailable || target == kv.ErrUnavailable
}

// IllegalMoveError reports a refused resource state move. It matches
// ErrIllegalMove.
type IllegalMoveError struct {
	Resource string
	From, To wire.ResourceState
	// Why explains the refusal when it is more than the move table.
	Why string
}

// Error names the resource, from and to.
func (e *IllegalMoveError) Error() string {
	msg := fmt.Sprintf("resource %s: illegal move %s -> %s", e.Resource, e.From, e.To)
	if e.Why != "" {
		msg += ": " + e.Why
	}
	return msg
}

// Is makes errors.Is(err, ErrIllegalMove) true.
func (e *IllegalMoveError) Is(target error) bool { return target == ErrIllegalMove }
