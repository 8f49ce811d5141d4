package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// Holder holds a lease and renews it every TTL/3 until Release. Its Context
// is cancelled, with ErrLost as the cause, as soon as a renewal finds
// the lease lost, or when renewals have failed for 2/3 of the TTL (before
// the broker can expire it), so that work under the lease stops.
type Holder struct {
	l   *Leases
	ttl time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   lifecycle.Stop
	done   chan struct{}

	mu       sync.Mutex
	lease    wire.Lease
	released bool
}

// Hold acquires the lease on resource for owner (see Acquire) and keeps
// renewing it. The Holder's context derives from ctx: cancelling ctx stops
// the renewals (the lease then lapses after its TTL unless released).
func (l *Leases) Hold(ctx context.Context, resource, owner string, ttl time.Duration) (*Holder, error) {
	ttl, err := TTL(ttl)
	if err != nil {
		return nil, err
	}
	lease, err := l.Acquire(ctx, resource, owner, ttl)
	if err != nil {
		return nil, err
	}
	return l.hold(ctx, lease, ttl), nil
}

func (l *Leases) hold(ctx context.Context, lease wire.Lease, ttl time.Duration) *Holder {
	hctx, cancel := context.WithCancelCause(ctx)
	h := &Holder{
		l: l, ttl: ttl, ctx: hctx, cancel: cancel, lease: lease, done: make(chan struct{}),
	}
	go h.renewLoop()
	return h
}

// Context is cancelled when the lease is lost (cause ErrLost), released
// (cause context.Canceled), or when the context given to Hold ends.
func (h *Holder) Context() context.Context { return h.ctx }

// Err returns why the holder's context ended, or nil while it holds.
func (h *Holder) Err() error {
	if h.ctx.Err() == nil {
		return nil
	}
	return context.Cause(h.ctx)
}

// Lease returns the lease as last renewed.
func (h *Holder) Lease() wire.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// TTL returns the lease's TTL.
func (h *Holder) TTL() time.Duration { return h.ttl }

func (h *Holder) renewLoop() {
	defer close(h.done)
	clk := h.l.clock
	interval := max(h.ttl/3, 100*time.Millisecond)
	lastOK := clk.Now()
	failing := false
	t := clk.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-h.stop.Done():
			return
		case <-h.ctx.Done():
			return
		case <-t.C():
		}
		// The broker counts a renewal's TTL from when it stores it, at the
		// earliest when it was sent: lastOK is that send time, and no
		// renewal may outlast the lease it renews.
		sent := clk.Now()
		rctx, cancel := context.WithTimeout(h.ctx, min(interval, lastOK.Add(h.ttl).Sub(sent)))
		lease, err := h.l.Renew(rctx, h.Lease(), h.ttl)
		if errors.Is(err, ErrLost) && failing {
			// A renewal that timed out may have been stored all the same,
			// moving the revision on: if the lease is still this owner's,
			// carry on from it.
			if cur, gerr := h.l.Get(rctx, h.Lease().Resource); gerr == nil && cur.Owner == h.Lease().Owner {
				lease, err = h.l.Renew(rctx, cur, h.ttl)
			}
		}
		cancel()
		failing = err != nil
		switch {
		case err == nil:
			h.mu.Lock()
			h.lease = lease
			h.mu.Unlock()
			lastOK = sent
			t.Reset(interval)
		case errors.Is(err, ErrLost):
			h.l.log.Warn("lease lost", "resource_id", h.Lease().Resource, "err", err)
			h.cancel(err)
			return
		case h.ctx.Err() != nil:
			return
		case clk.Now().Sub(lastOK) >= h.ttl-interval:
			err = fmt.Errorf("%w: renewals failing for %v: %w", ErrLost, clk.Now().Sub(lastOK), err)
			h.l.log.Warn("lease lost", "resource_id", h.Lease().Resource, "err", err)
			h.cancel(err)
			return
		default:
			h.l.log.Warn("lease renewal failed, retrying", "resource_id", h.Lease().Resource, "err", err)
			t.Reset(interval / 4)
		}
	}
}

// stopRenewing ends the renewals and waits for the loop to return.
func (h *Holder) stopRenewing() {
	h.stop.Stop()
	<-h.done
}

// Release stops the renewals and releases the lease. It returns
// ErrLost if the lease was lost before; calling it again returns nil.
func (h *Holder) Release(ctx context.Context) error {
	h.stopRenewing()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	h.released = true
	defer h.cancel(context.Canceled)
	if err := h.Err(); errors.Is(err, ErrLost) {
		return err
	}
	return h.l.Release(ctx, h.lease)
}
