package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/lease"
)

func TestResourceLifecycle(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1", Route: "office"})
	rh, err := r.Lease(ctx, "cam1", "w1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	res := resourceOf(t, r, "cam1")
	if res.State != wire.ResourceLeased || res.LeaseOwner != "w1" || res.LeaseUntil == nil || res.RouteID != "office" {
		t.Errorf("after Lease: %+v, want LEASED by w1 with lease_until, route office", res.Resource)
	}
	// A contender is refused and changes nothing.
	_, err = r.Lease(ctx, "cam1", "w2", 5*time.Second)
	var ce *lease.ConflictError
	if !errors.As(err, &ce) || ce.Holder != "w1" {
		t.Fatalf("contender Lease err = %v, want a conflict naming w1", err)
	}
	if got := resourceOf(t, r, "cam1"); got.Revision != res.Revision {
		t.Errorf("resource revision after a conflict = %d, want %d (untouched)", got.Revision, res.Revision)
	}
	if err := rh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := resourceOf(t, r, "cam1").State; got != wire.ResourceRunning {
		t.Errorf("after Start: state = %s, want RUNNING", got)
	}
	// A task failure is not a resource fault.
	if err := rh.Finish(ctx, lease.OutcomeOf(errors.New("exit status 1"))); err != nil {
		t.Fatal(err)
	}
	res = resourceOf(t, r, "cam1")
	if res.State != wire.ResourceAvailable || res.LeaseOwner != "" || res.LastError != "" {
		t.Errorf("after a task failure: %+v, want AVAILABLE without owner or error", res.Resource)
	}
	if _, err := r.Leases().Get(ctx, "cam1"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("lease after Finish: err = %v, want ErrNotFound", err)
	}
	if err := rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Errorf("second Finish = %v, want nil", err)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// registered, leased, running, available
	moves := auditEvents(t, env, wire.EventResourceStateChanged, "cam1")
	var got []string
	for _, ev := range moves {
		got = append(got, ev.Message)
	}
	if len(moves) != 4 {
		t.Errorf("state change events = %q, want 4 (registered, LEASED, RUNNING, AVAILABLE)", got)
	}
	for _, typ := range []wire.EventType{wire.EventResourceLeased, wire.EventResourceReleased, wire.EventLeaseConflict} {
		if n := len(auditEvents(t, env, typ, "cam1")); n != 1 {
			t.Errorf("%s events = %d, want 1", typ, n)
		}
	}
}

func TestResourceFault(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	rh, err := r.Lease(ctx, "cam1", "w1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Finish with a fault from LEASED: it goes through RUNNING to FAULT.
	if err := rh.Finish(ctx, lease.OutcomeOf(lease.Fault(errors.New("camera not responding")))); err != nil {
		t.Fatal(err)
	}
	res := resourceOf(t, r, "cam1")
	if res.State != wire.ResourceFault || res.LastError != "resource fault: camera not responding" {
		t.Errorf("after a fault: %+v, want FAULT with the error", res.Resource)
	}
	_, err = r.Lease(ctx, "cam1", "w2", 5*time.Second)
	var ue *lease.UnavailableError
	if !errors.As(err, &ue) || ue.State != wire.ResourceFault {
		t.Fatalf("Lease of a FAULT resource: err = %v, want an UnavailableError", err)
	}
	if _, err := r.Leases().Get(ctx, "cam1"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("lease of a refused resource: err = %v, want ErrNotFound (nothing taken)", err)
	}
	if _, err := r.Enable(ctx, "cam1", "camera replaced"); err != nil {
		t.Fatal(err)
	}
	if got := resourceOf(t, r, "cam1").State; got != wire.ResourceAvailable {
		t.Errorf("after Enable: %s, want AVAILABLE", got)
	}
}

func TestDisabledCannotBeLeased(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	if _, err := r.Disable(ctx, "cam1", "maintenance"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lease(ctx, "cam1", "w1", 5*time.Second); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("Lease of a DISABLED resource: err = %v, want ErrUnavailable", err)
	}
	if _, err := r.Leases().Get(ctx, "cam1"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("lease after refusal: err = %v, want ErrNotFound", err)
	}
	// Disabled while running: the holder's Finish leaves it DISABLED.
	if _, err := r.Enable(ctx, "cam1", ""); err != nil {
		t.Fatal(err)
	}
	rh, err := r.Lease(ctx, "cam1", "w1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := rh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Disable(ctx, "cam1", ""); err != nil {
		t.Fatal(err)
	}
	if err := rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if got := resourceOf(t, r, "cam1").State; got != wire.ResourceDisabled {
		t.Errorf("after Finish of a disabled resource: %s, want DISABLED", got)
	}
}

func TestIllegalMoves(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	for _, to := range []wire.ResourceState{wire.ResourceLeased, wire.ResourceRunning, wire.ResourceCooldown, wire.ResourceFault} {
		before := resourceOf(t, r, "cam1")
		_, err := r.SetState(ctx, "cam1", to, "test")
		var ime *lease.IllegalMoveError
		if !errors.As(err, &ime) || ime.From != wire.ResourceAvailable || ime.To != to {
			t.Errorf("SetState AVAILABLE -> %s: err = %v, want an IllegalMoveError naming both", to, err)
		}
		if after := resourceOf(t, r, "cam1"); after.Revision != before.Revision {
			t.Errorf("an illegal move changed the resource: revision %d -> %d", before.Revision, after.Revision)
		}
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if evs := auditEvents(t, env, wire.EventResourceMoveRefused, "cam1"); len(evs) != 4 {
		t.Errorf("RESOURCE_MOVE_REFUSED events = %d, want one per refused move (4)", len(evs))
	}
	if _, err := r.SetState(ctx, "cam1", wire.ResourceDisabled, ""); err == nil {
		t.Error("SetState without a reason = nil error, want one")
	}
	if _, err := r.SetState(ctx, "nope", wire.ResourceDisabled, "x"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("SetState of an unknown resource: err = %v, want ErrNotFound", err)
	}
	if _, err := r.Enable(ctx, "nope", ""); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Enable of an unknown resource: err = %v, want ErrNotFound", err)
	}
	// The table of the contract.
	allowed := map[[2]wire.ResourceState]bool{
		{wire.ResourceAvailable, wire.ResourceLeased}: true, {wire.ResourceLeased, wire.ResourceRunning}: true,
		{wire.ResourceRunning, wire.ResourceCooldown}: true, {wire.ResourceRunning, wire.ResourceFault}: true,
		{wire.ResourceCooldown, wire.ResourceAvailable}: true, {wire.ResourceFault, wire.ResourceAvailable}: true,
		{wire.ResourceFault, wire.ResourceDisabled}: true, {wire.ResourceLeased, wire.ResourceAvailable}: true,
		{wire.ResourceRunning, wire.ResourceAvailable}: true, {wire.ResourceDisabled, wire.ResourceAvailable}: true,
		{wire.ResourceAvailable, wire.ResourceDisabled}: true, {wire.ResourceLeased, wire.ResourceDisabled}: true,
		{wire.ResourceRunning, wire.ResourceDisabled}: true, {wire.ResourceCooldown, wire.ResourceDisabled}: true,
	}
	for _, from := range wire.ResourceStates {
		for _, to := range wire.ResourceStates {
			if got, want := lease.AllowedMove(from, to), allowed[[2]wire.ResourceState{from, to}]; got != want {
				t.Errorf("AllowedMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestAddIsIdempotent(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	if _, err := r.Disable(ctx, "cam1", "broken"); err != nil {
		t.Fatal(err)
	}
	res, err := r.Add(ctx, lease.ResourceSpec{ID: "cam1", Route: "office", Reclaim: lease.ReclaimFault})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != wire.ResourceDisabled || res.RouteID != "office" || res.Reclaim != lease.ReclaimFault {
		t.Errorf("re-added resource = %+v, want DISABLED kept, route office, reclaim fault", res)
	}
	if _, err := r.Add(ctx, lease.ResourceSpec{ID: "cam2", Reclaim: "sometimes"}); err == nil {
		t.Error("Add with a bad reclaim policy = nil error")
	}
	list, err := r.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "cam1" {
		t.Errorf("List = %+v, %v; want cam1 only", list, err)
	}
}

func TestUnregisteredIsPlainLease(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t)
	rh, err := r.Lease(ctx, "scratch", "w1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rh.Registered() {
		t.Error("Registered = true for an unregistered id")
	}
	if _, err := r.Lease(ctx, "scratch", "w2", 5*time.Second); !errors.Is(err, lease.ErrConflict) {
		t.Errorf("contender on a plain lease: err = %v, want ErrConflict", err)
	}
	if err := rh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, "scratch"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Get of a plain lease's id: err = %v, want ErrNotFound (no resource created)", err)
	}
}

func TestDetachThenRelease(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	rh, err := r.Lease(ctx, "cam1", "w1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	detached := rh.Detach()
	if err := rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Errorf("Finish after Detach = %v, want nil", err)
	}
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceLeased || res.LeaseOwner != "w1" {
		t.Errorf("after Detach: %+v, want LEASED by w1 kept", res.Resource)
	}
	stale := detached
	stale.Revision++
	if err := r.Release(ctx, stale, lease.Outcome{}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("Release at a wrong revision: err = %v, want ErrLost", err)
	}
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceLeased {
		t.Errorf("after a refused Release: %s, want LEASED", res.State)
	}
	if err := r.Release(ctx, detached, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceAvailable || res.LeaseOwner != "" {
		t.Errorf("after Release: %+v, want AVAILABLE", res.Resource)
	}
	if _, err := r.Leases().Get(ctx, "cam1"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("lease after Release: err = %v, want ErrNotFound", err)
	}
}
