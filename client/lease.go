package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gantry-dev/gantry/lease"
)

// LeaseOption tunes AcquireLease and HoldLease.
type LeaseOption func(*leaseSettings)

type leaseSettings struct {
	wait     bool
	timeout  time.Duration
	onChange func(WaitStatus)
}

// WaitInLine makes AcquireLease and HoldLease wait for a resource that
// another owner holds (or that is cooling down, DISABLED or FAULT) instead
// of failing: they take a place in the resource's line, the same line
// tasks wait in (priority, then arrival), and take the lease the moment
// their turn comes: at its release, its expiry, the end of its cooldown or
// its enable. timeout bounds the wait; 0 waits as long as ctx lasts (the
// client's timeout does not bound it). A wait that runs out is a
// *WaitError that matches ErrConflict; the place in line is given up.
func WaitInLine(timeout time.Duration) LeaseOption {
	return func(s *leaseSettings) { s.wait, s.timeout = true, timeout }
}

// OnWait calls fn, while WaitInLine waits, once the waiter is in line and
// each time what it sees changes: the holder and its expiry, the
// resource's state, its place in line.
func OnWait(fn func(WaitStatus)) LeaseOption {
	return func(s *leaseSettings) { s.onChange = fn }
}

func leaseOptions(opts []LeaseOption) leaseSettings {
	var s leaseSettings
	for _, o := range opts {
		o(&s)
	}
	return s
}

// AcquireLease takes the lease on resource for owner, for ttl (whole
// seconds, at least 1 s), and moves a registered resource AVAILABLE ->
// LEASED. It does not renew it: renew it with RenewLease before it lapses,
// or release it with ReleaseLease (HoldLease renews in the background). If
// owner already holds it, the lease is renewed. Another owner's lease is
// never taken over: a *ConflictError (ErrConflict) names the holder; a
// DISABLED or FAULT resource is an *UnavailableError (ErrUnavailable).
// With WaitInLine it waits for its turn instead.
func (c *Client) AcquireLease(ctx context.Context, resource, owner string, ttl time.Duration, opts ...LeaseOption) (Lease, error) {
	s := leaseOptions(opts)
	if !s.wait {
		var cancel context.CancelFunc
		ctx, cancel = c.bound(ctx)
		defer cancel()
	}
	rh, err := c.lease(ctx, resource, owner, ttl, s)
	if err != nil {
		return Lease{}, err
	}
	return rh.Detach(), nil
}

// HoldLease takes the lease on resource for owner as AcquireLease does and
// keeps renewing it every ttl/3 until the holder's Finish. The holder's
// Context derives from ctx and ends, with ErrLeaseLost as its cause, as
// soon as the lease is lost, so that the work under it stops; Start moves a
// registered resource to RUNNING. Call Finish when the work ends.
func (c *Client) HoldLease(ctx context.Context, resource, owner string, ttl time.Duration, opts ...LeaseOption) (*ResourceHolder, error) {
	return c.lease(ctx, resource, owner, ttl, leaseOptions(opts))
}

func (c *Client) lease(ctx context.Context, resource, owner string, ttl time.Duration, s leaseSettings) (*ResourceHolder, error) {
	r, err := c.resourceStore()
	if err != nil {
		return nil, err
	}
	if !s.wait {
		return r.Lease(ctx, resource, owner, ttl)
	}
	return r.LeaseWait(ctx, resource, owner, ttl, lease.WaitOptions{Timeout: s.timeout, OnChange: s.onChange})
}

// RenewLease restarts the TTL of owner's lease on resource, with ttl (0:
// the TTL it was taken with). Another owner's lease is never renewed (a
// *ConflictError); no lease on resource is ErrNotFound.
func (c *Client) RenewLease(ctx context.Context, resource, owner string, ttl time.Duration) (Lease, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	r, cur, err := c.heldBy(ctx, resource, owner)
	if err != nil {
		return Lease{}, err
	}
	return r.Leases().Renew(ctx, cur, ttl)
}

// ReleaseLease gives up owner's lease on resource; a registered resource
// returns to AVAILABLE. Another owner's lease is never released (a
// *ConflictError); no lease on resource is ErrNotFound.
func (c *Client) ReleaseLease(ctx context.Context, resource, owner string) error {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	r, cur, err := c.heldBy(ctx, resource, owner)
	if err != nil {
		return err
	}
	return r.Release(ctx, cur, lease.Outcome{})
}

// heldBy returns the current lease on resource if owner holds it: a
// *ConflictError if someone else does, ErrNotFound if nobody does.
func (c *Client) heldBy(ctx context.Context, resource, owner string) (*lease.Resources, Lease, error) {
	if owner == "" {
		return nil, Lease{}, fmt.Errorf("%w: an owner is required", ErrInvalid)
	}
	r, err := c.resourceStore()
	if err != nil {
		return nil, Lease{}, err
	}
	cur, err := r.Leases().Get(ctx, resource)
	if errors.Is(err, ErrNotFound) {
		return nil, Lease{}, fmt.Errorf("no lease on %s (it lapsed or was released; take it again): %w", resource, ErrNotFound)
	}
	if err != nil {
		return nil, Lease{}, err
	}
	if cur.Owner != owner {
		return nil, Lease{}, &ConflictError{Resource: resource, Holder: cur.Owner, ExpiresAt: cur.ExpiresAt, Revision: cur.Revision}
	}
	return r, cur, nil
}

// Leases returns every live lease.
func (c *Client) Leases(ctx context.Context) ([]Lease, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	r, err := c.resourceStore()
	if err != nil {
		return nil, err
	}
	return r.Leases().List(ctx)
}

// AddResource registers a resource as AVAILABLE. It is idempotent: an
// existing resource keeps its state and takes spec's route and reclaim
// policy.
func (c *Client) AddResource(ctx context.Context, spec ResourceSpec) (Resource, error) {
	return c.resourceOp(ctx, func(ctx context.Context, r *lease.Resources) (Resource, error) { return r.Add(ctx, spec) })
}

// Resource returns resource id.
func (c *Client) Resource(ctx context.Context, id string) (Resource, error) {
	return c.resourceOp(ctx, func(ctx context.Context, r *lease.Resources) (Resource, error) { return r.Get(ctx, id) })
}

// Resources returns every registered resource.
func (c *Client) Resources(ctx context.Context) ([]Resource, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	r, err := c.resourceStore()
	if err != nil {
		return nil, err
	}
	return r.List(ctx)
}

// SetResourceState moves resource id to state to (AVAILABLE, FAULT or
// DISABLED), recording reason in the audit trail. A move the state machine
// does not allow is an *IllegalMoveError (ErrIllegalMove).
func (c *Client) SetResourceState(ctx context.Context, id string, to ResourceState, reason string) (Resource, error) {
	return c.resourceOp(ctx, func(ctx context.Context, r *lease.Resources) (Resource, error) {
		return r.SetState(ctx, id, to, reason)
	})
}

// DisableResource moves resource id to DISABLED from any state: it cannot
// be leased until enabled. A holder running on it keeps its lease until it
// finishes.
func (c *Client) DisableResource(ctx context.Context, id, reason string) (Resource, error) {
	return c.resourceOp(ctx, func(ctx context.Context, r *lease.Resources) (Resource, error) { return r.Disable(ctx, id, reason) })
}

// EnableResource returns a DISABLED or FAULT resource to AVAILABLE.
func (c *Client) EnableResource(ctx context.Context, id, reason string) (Resource, error) {
	return c.resourceOp(ctx, func(ctx context.Context, r *lease.Resources) (Resource, error) { return r.Enable(ctx, id, reason) })
}

func (c *Client) resourceOp(ctx context.Context, op func(context.Context, *lease.Resources) (Resource, error)) (Resource, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	r, err := c.resourceStore()
	if err != nil {
		return Resource{}, err
	}
	return op(ctx, r)
}
