package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
)

// Outcome is how the work under a resource lease ended, as far as the
// resource is concerned. The zero Outcome returns the resource to AVAILABLE:
// a task's own failure is not the resource's.
type Outcome struct {
	// Fault, when set, is a resource failure (the device, application or
	// profile is broken): the resource goes to FAULT with this error and is
	// not leased again until an operator enables it.
	Fault error
	// Cooldown, when positive and Fault is nil, rests the resource: it goes
	// to COOLDOWN and back to AVAILABLE once Cooldown (whole seconds, at
	// least 1 s) has passed. A lease owned by CooldownOwner(owner) holds it
	// meanwhile, so the broker's TTL times the cooldown.
	Cooldown time.Duration
}

// faultError marks an error as a resource failure.
type faultError struct{ err error }

func (e *faultError) Error() string { return "resource fault: " + e.err.Error() }
func (e *faultError) Unwrap() error { return e.err }

// Fault marks err as a resource failure rather than a task failure; see
// OutcomeOf. Fault(nil) is nil.
func Fault(err error) error {
	if err == nil {
		return nil
	}
	return &faultError{err: err}
}

// IsFault reports whether err, or an error it wraps, was marked by Fault.
func IsFault(err error) bool {
	var fe *faultError
	return errors.As(err, &fe)
}

// OutcomeOf returns the resource outcome of work that ended with err: a
// fault if err was marked by Fault, otherwise a plain release.
func OutcomeOf(err error) Outcome {
	if IsFault(err) {
		return Outcome{Fault: err}
	}
	return Outcome{}
}

// ResourceHolder is a task's hold on a resource: a renewed lease and, for a
// registered resource, its state (LEASED, then RUNNING after Start). Work
// must stop when Context is done.
type ResourceHolder struct {
	r          *Resources
	h          *Holder
	id, owner  string
	registered bool

	// last is the resource as this holder last wrote it, so that the next
	// move can compare-and-swap without reading first.
	lastMu sync.Mutex
	last   *Resource
}

func (rh *ResourceHolder) known() *Resource {
	rh.lastMu.Lock()
	defer rh.lastMu.Unlock()
	return rh.last
}

func (rh *ResourceHolder) remember(res Resource, wrote bool) {
	rh.lastMu.Lock()
	defer rh.lastMu.Unlock()
	if wrote {
		rh.last = &res
	} else {
		rh.last = nil
	}
}

// Lease checks resource id, acquires its lease for owner (renewed every
// ttl/3) and moves it AVAILABLE -> LEASED. A DISABLED or FAULT resource is
// refused with an *UnavailableError before anything is taken; a lease held
// by another owner is a *ConflictError (errors.Is(err, ErrConflict)), as is
// a resource in COOLDOWN. A resource left LEASED or RUNNING by a holder
// whose lease is gone is reclaimed first (see Reclaim). An id that is not
// registered gets a plain lease with no state machine.
func (r *Resources) Lease(ctx context.Context, id, owner string, ttl time.Duration) (*ResourceHolder, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	cur, err := r.get(ctx, id)
	registered := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("lease resource %s: %w", id, err)
	}
	return r.leaseFrom(ctx, id, owner, ttl, cur, registered)
}

// leaseFrom is Lease from cur, the resource as last read (registered:
// whether it was found). A stale cur costs a read: every move is a
// compare-and-swap on its revision.
func (r *Resources) leaseFrom(ctx context.Context, id, owner string, ttl time.Duration, cur Resource, registered bool) (*ResourceHolder, error) {
	if registered && (cur.State == wire.ResourceDisabled || cur.State == wire.ResourceFault) {
		return nil, &UnavailableError{Resource: id, State: cur.State, LastError: cur.LastError}
	}
	h, err := r.leases.Hold(ctx, id, owner, ttl)
	if err != nil {
		return nil, err
	}
	rh := &ResourceHolder{r: r, h: h, id: id, owner: owner, registered: registered}
	if !registered {
		return rh, nil
	}
	if err := rh.take(ctx, cur); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resourceTimeout)
		defer cancel()
		if rerr := h.Release(cctx); rerr != nil {
			r.log.Warn("release after failed lease", "resource_id", id, "err", rerr)
		}
		return nil, err
	}
	return rh, nil
}

// take moves the resource to LEASED for the holder, reclaiming it first if a
// previous holder left it behind.
func (rh *ResourceHolder) take(ctx context.Context, read Resource) error {
	errStale := errors.New("stale")
	known := &read
	for range maxCASAttempts {
		lease := rh.h.Lease()
		res, wrote, err := rh.r.changeFrom(ctx, rh.id, "leased by "+rh.owner, known, func(cur Resource) (Resource, error) {
			switch cur.State {
			case wire.ResourceAvailable:
				next := cur
				next.State = wire.ResourceLeased
				next.LeaseOwner = rh.owner
				until := lease.ExpiresAt
				next.LeaseUntil = &until
				return next, nil
			case wire.ResourceLeased, wire.ResourceRunning:
				if cur.LeaseOwner == rh.owner {
					return cur, errNoChange
				}
				return cur, errStale
			case wire.ResourceCooldown:
				return cur, errStale
			}
			return cur, &UnavailableError{Resource: rh.id, State: cur.State, LastError: cur.LastError}
		})
		known = nil
		switch {
		case errors.Is(err, errStale):
			if _, _, err := rh.r.Reclaim(ctx, rh.id, "lease of the previous holder is gone"); err != nil {
				return err
			}
		case errors.Is(err, ErrNotFound):
			rh.registered = false
			return nil
		default:
			rh.remember(res, wrote && err == nil)
			return err
		}
	}
	return fmt.Errorf("lease resource %s: still contended after %d attempts", rh.id, maxCASAttempts)
}

// Context is cancelled when the lease is lost: stop working on the resource.
func (rh *ResourceHolder) Context() context.Context { return rh.h.Context() }

// Lease returns the lease as last renewed.
func (rh *ResourceHolder) Lease() wire.Lease { return rh.h.Lease() }

// Registered reports whether the resource is registered (has a state
// machine) or is leased plainly.
func (rh *ResourceHolder) Registered() bool { return rh.registered }

// Start moves the resource LEASED -> RUNNING. It returns ErrLost if the
// lease is lost or the resource is no longer the holder's.
func (rh *ResourceHolder) Start(ctx context.Context) error {
	if err := rh.h.Err(); errors.Is(err, ErrLost) {
		return err
	}
	if !rh.registered {
		return nil
	}
	res, wrote, err := rh.r.start(ctx, rh.id, rh.owner, rh.known())
	rh.remember(res, wrote && err == nil)
	return err
}

// start moves id LEASED -> RUNNING for owner; it reports whether it wrote.
func (r *Resources) start(ctx context.Context, id, owner string, known *Resource) (Resource, bool, error) {
	res, wrote, err := r.changeFrom(ctx, id, "started by "+owner, known, func(cur Resource) (Resource, error) {
		if cur.LeaseOwner != owner {
			return cur, fmt.Errorf("%w: resource %s is %s, no longer %s's", ErrLost, id, cur.State, owner)
		}
		if cur.State == wire.ResourceRunning {
			return cur, errNoChange
		}
		next := cur
		next.State = wire.ResourceRunning
		return next, nil
	})
	if err != nil {
		return Resource{}, false, fmt.Errorf("start on resource %s: %w", id, err)
	}
	return res, wrote, nil
}

// Finish ends the hold: it stops the renewals, moves the resource as out
// says (AVAILABLE, FAULT or COOLDOWN) and releases the lease (or hands it
// to the cooldown). If the lease was lost, Finish changes nothing and
// returns ErrLost: the keeper reclaims the resource. A resource an
// operator moved meanwhile (say, DISABLED) keeps its state. Calling it again
// returns nil.
func (rh *ResourceHolder) Finish(ctx context.Context, out Outcome) error {
	lease, ok, err := rh.detach()
	if !ok {
		return err
	}
	return rh.r.finish(ctx, rh.id, rh.owner, lease, rh.registered, out, rh.known())
}

// Detach stops the renewals and returns the lease, leaving it and the
// resource's state as they are: the lease lapses after its TTL unless it is
// renewed (Leases.Renew) or released (Resources.Release) by whoever keeps
// it. `gantry lease acquire` uses it. Finish after Detach does nothing.
func (rh *ResourceHolder) Detach() wire.Lease {
	lease, _, _ := rh.detach()
	return lease
}

// detach stops the renewals once; ok is false if the hold was already
// ended, or lost (err is then ErrLost).
func (rh *ResourceHolder) detach() (wire.Lease, bool, error) {
	h := rh.h
	h.stopRenewing()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return h.lease, false, nil
	}
	h.released = true
	defer h.cancel(context.Canceled)
	if err := h.Err(); errors.Is(err, ErrLost) {
		return h.lease, false, err
	}
	return h.lease, true, nil
}

// Release ends a hold on lease that no Holder renews any more (see Detach),
// as Finish with out would. The lease must still be current: otherwise
// Release returns ErrLost (with a *ConflictError if another owner
// holds it) and changes nothing.
func (r *Resources) Release(ctx context.Context, lease wire.Lease, out Outcome) error {
	if err := checkID(lease.Resource); err != nil {
		return err
	}
	cur, err := r.leases.Get(ctx, lease.Resource)
	if errors.Is(err, ErrNotFound) || (err == nil && cur.Revision != lease.Revision) {
		return fmt.Errorf("release %s: %w", lease.Resource, r.leases.lost(ctx, "release", lease))
	}
	if err != nil {
		return fmt.Errorf("release %s: %w", lease.Resource, err)
	}
	_, err = r.get(ctx, lease.Resource)
	registered := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("release %s: %w", lease.Resource, err)
	}
	return r.finish(ctx, lease.Resource, lease.Owner, lease, registered, out, nil)
}

// finish moves the resource as out says and releases (or hands over) the
// lease; known is the resource as the holder last wrote it, if it did.
func (r *Resources) finish(ctx context.Context, id, owner string, lease wire.Lease, registered bool, out Outcome, known *Resource) error {
	if out.Fault == nil && out.Cooldown > 0 {
		return r.cooldown(ctx, id, owner, lease, registered, out.Cooldown, known)
	}
	var errs []error
	if registered {
		if out.Fault != nil {
			// FAULT is reached from RUNNING only.
			res, wrote, err := r.start(ctx, id, owner, known)
			if err != nil && !errors.Is(err, ErrLost) {
				errs = append(errs, err)
			}
			if wrote {
				known = &res
			}
		}
		reason := "released by " + owner
		if out.Fault != nil {
			reason = "fault under " + owner + ": " + out.Fault.Error()
		}
		_, _, err := r.changeFrom(ctx, id, reason, known, func(cur Resource) (Resource, error) {
			if cur.LeaseOwner != owner || (cur.State != wire.ResourceLeased && cur.State != wire.ResourceRunning) {
				return cur, errNoChange
			}
			next := cur
			next.LeaseOwner, next.LeaseUntil = "", nil
			next.State = wire.ResourceAvailable
			if out.Fault != nil {
				next.State = wire.ResourceFault
				next.LastError = out.Fault.Error()
			}
			return next, nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("finish on resource %s: %w", id, err))
		}
	}
	if err := r.leases.Release(ctx, lease); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cooldown hands the lease to CooldownOwner for d, then moves the resource
// to COOLDOWN. The lease goes first, so a keeper never sees a COOLDOWN
// resource without its cooldown lease.
func (r *Resources) cooldown(ctx context.Context, id, owner string, lease wire.Lease, registered bool, d time.Duration, known *Resource) error {
	d, err := TTL(d)
	if err != nil {
		return err
	}
	if registered {
		res, wrote, err := r.start(ctx, id, owner, known)
		if err != nil && !errors.Is(err, ErrLost) {
			return err
		}
		if wrote {
			known = &res
		}
	}
	cl, err := r.leases.write(ctx, lease, CooldownOwner(owner), d)
	if err != nil {
		return fmt.Errorf("cooldown on resource %s: %w", id, err)
	}
	r.leases.ev.emit(wire.Event{
		Type: wire.EventResourceReleased, ResourceID: id,
		Message: fmt.Sprintf("%s released %s into a %v cooldown", owner, id, d),
		Payload: audit.Payload(map[string]any{"owner": owner, "cooldown": d.String(), "until": cl.ExpiresAt, "revision": cl.Revision}),
	})
	if !registered {
		return nil
	}
	_, _, err = r.changeFrom(ctx, id, fmt.Sprintf("cooldown %v after %s", d, owner), known, func(cur Resource) (Resource, error) {
		if cur.LeaseOwner != owner || cur.State != wire.ResourceRunning {
			return cur, errNoChange
		}
		next := cur
		next.State = wire.ResourceCooldown
		next.LeaseOwner = ""
		until := cl.ExpiresAt
		next.LeaseUntil = &until
		return next, nil
	})
	if err != nil {
		return fmt.Errorf("cooldown on resource %s: %w", id, err)
	}
	return nil
}
