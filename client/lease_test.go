package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

func TestLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)

	l, err := c.AcquireLease(ctx, "cam1", "alice", 30*time.Second)
	if err != nil || l.Owner != "alice" || l.Resource != "cam1" || l.Revision == 0 {
		t.Fatalf("AcquireLease = %+v, %v; want alice's lease on cam1", l, err)
	}
	_, err = c.AcquireLease(ctx, "cam1", "bob", 30*time.Second)
	var ce *client.ConflictError
	if !errors.Is(err, client.ErrConflict) || !errors.As(err, &ce) || ce.Holder != "alice" || ce.ExpiresAt.IsZero() {
		t.Errorf("AcquireLease by bob = %v, want a *ConflictError naming alice and the expiry", err)
	}
	if _, err := c.RenewLease(ctx, "cam1", "bob", 0); !errors.As(err, &ce) || ce.Holder != "alice" {
		t.Errorf("RenewLease by bob = %v, want a conflict naming alice", err)
	}
	if err := c.ReleaseLease(ctx, "cam1", "bob"); !errors.Is(err, client.ErrConflict) {
		t.Errorf("ReleaseLease by bob = %v, want ErrConflict", err)
	}
	renewed, err := c.RenewLease(ctx, "cam1", "alice", time.Minute)
	if err != nil || renewed.Revision <= l.Revision {
		t.Errorf("RenewLease by alice = %+v, %v; want a later revision than %d", renewed, err, l.Revision)
	}
	ls, err := c.Leases(ctx)
	if err != nil || len(ls) != 1 || ls[0].Owner != "alice" {
		t.Errorf("Leases = %+v, %v; want alice's", ls, err)
	}
	if err := c.ReleaseLease(ctx, "cam1", "alice"); err != nil {
		t.Errorf("ReleaseLease by alice = %v, want nil", err)
	}
	if err := c.ReleaseLease(ctx, "cam1", "alice"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("ReleaseLease again = %v, want ErrNotFound", err)
	}
	if _, err := c.AcquireLease(ctx, "cam.1", "alice", time.Second); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("AcquireLease(cam.1) = %v, want ErrInvalid", err)
	}
}

func TestResourcesAndHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)

	res, err := c.AddResource(ctx, client.ResourceSpec{ID: "cam1", Route: "office"})
	if err != nil || res.State != wire.ResourceAvailable || res.RouteID != "office" {
		t.Fatalf("AddResource = %+v, %v; want cam1 AVAILABLE on office", res, err)
	}
	h, err := c.HoldLease(ctx, "cam1", "runner", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err = c.Resource(ctx, "cam1"); err != nil || res.State != wire.ResourceRunning || res.LeaseOwner != "runner" {
		t.Errorf("Resource while held = %s by %q, %v; want RUNNING by runner", res.State, res.LeaseOwner, err)
	}
	if _, err := c.AcquireLease(ctx, "cam1", "other", time.Second); !errors.Is(err, client.ErrConflict) {
		t.Errorf("AcquireLease while held = %v, want ErrConflict", err)
	}
	// The holder renews in the background: past its TTL it still holds.
	select {
	case <-h.Context().Done():
		t.Fatalf("holder context = done (%v), want held", context.Cause(h.Context()))
	case <-time.After(2500 * time.Millisecond):
	}
	if err := h.Finish(ctx, client.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if res, err = c.Resource(ctx, "cam1"); err != nil || res.State != wire.ResourceAvailable {
		t.Errorf("Resource after Finish = %s, %v; want AVAILABLE", res.State, err)
	}

	if _, err := c.SetResourceState(ctx, "cam1", wire.ResourceRunning, "by hand"); !errors.Is(err, client.ErrIllegalMove) {
		t.Errorf("SetResourceState(RUNNING) = %v, want ErrIllegalMove", err)
	}
	if res, err = c.DisableResource(ctx, "cam1", "camera replaced"); err != nil || res.State != wire.ResourceDisabled {
		t.Errorf("DisableResource = %s, %v; want DISABLED", res.State, err)
	}
	var ue *client.UnavailableError
	if _, err := c.AcquireLease(ctx, "cam1", "alice", time.Second); !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &ue) {
		t.Errorf("AcquireLease of a DISABLED resource = %v, want an *UnavailableError", err)
	}
	if res, err = c.EnableResource(ctx, "cam1", "back"); err != nil || res.State != wire.ResourceAvailable {
		t.Errorf("EnableResource = %s, %v; want AVAILABLE", res.State, err)
	}
	if rs, err := c.Resources(ctx); err != nil || len(rs) != 1 {
		t.Errorf("Resources = %d, %v; want 1", len(rs), err)
	}
	if _, err := c.Resource(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Resource(nope) = %v, want ErrNotFound", err)
	}
}

func TestLeaseWaitInLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)
	if _, err := c.AddResource(ctx, client.ResourceSpec{ID: "cam1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcquireLease(ctx, "cam1", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	// Running out is a conflict naming the holder.
	_, err := c.AcquireLease(ctx, "cam1", "bob", time.Minute, client.WaitInLine(time.Second))
	var we *client.WaitError
	if !errors.Is(err, client.ErrConflict) || !errors.As(err, &we) || we.Last.Holder != "alice" {
		t.Fatalf("AcquireLease waiting 1s = %v, want a *WaitError matching ErrConflict, held by alice", err)
	}
	statuses := make(chan client.WaitStatus, 100)
	type result struct {
		h   *client.ResourceHolder
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := c.HoldLease(ctx, "cam1", "bob", time.Minute, client.WaitInLine(0), client.OnWait(func(s client.WaitStatus) { statuses <- s }))
		done <- result{h, err}
	}()
	var s client.WaitStatus
	select {
	case s = <-statuses:
	case <-time.After(10 * time.Second):
		t.Fatal("no wait status within 10s")
	}
	if s.Holder != "alice" || s.Position != 1 || s.Waiting != 1 {
		t.Errorf("status = %+v, want held by alice, bob 1st of 1", s)
	}
	if res, err := c.Resource(ctx, "cam1"); err != nil || len(res.Waiters) != 1 || res.Waiters[0].Owner != "bob" {
		t.Errorf("Resource while bob waits = %+v, %v; want bob in line", res.Waiters, err)
	}
	if err := c.ReleaseLease(ctx, "cam1", "alice"); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("bob did not get cam1 within 10s of its release")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := r.h.Lease().Owner; got != "bob" {
		t.Errorf("holder = %q, want bob", got)
	}
	if err := r.h.Finish(ctx, client.Outcome{}); err != nil {
		t.Fatal(err)
	}
}
