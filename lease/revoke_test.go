package lease_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/lease"
)

func TestRevokeAllAndReclaimAll(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"}, lease.ResourceSpec{ID: "cam2", Reclaim: lease.ReclaimFault}, lease.ResourceSpec{ID: "cam3"})
	for _, id := range []string{"cam1", "cam2", "plain"} {
		h, err := r.Lease(ctx, id, "worker-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if id == "cam2" {
			if err := h.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		h.Detach()
	}
	revoked, err := r.Leases().RevokeAll(ctx, "restored")
	if err != nil {
		t.Fatalf("RevokeAll: %v", err)
	}
	var ids []string
	for _, l := range revoked {
		ids = append(ids, l.Resource)
		if l.Owner != "worker-a" {
			t.Errorf("revoked lease %s owner = %q, want worker-a", l.Resource, l.Owner)
		}
	}
	slices.Sort(ids)
	if want := []string{"cam1", "cam2", "plain"}; !slices.Equal(ids, want) {
		t.Errorf("revoked = %v, want %v", ids, want)
	}
	if leases, err := r.Leases().List(ctx); err != nil || len(leases) != 0 {
		t.Errorf("leases after RevokeAll = %v (err %v), want none", leases, err)
	}
	moved, err := r.ReclaimAll(ctx, "restored")
	if err != nil {
		t.Fatalf("ReclaimAll: %v", err)
	}
	if len(moved) != 2 {
		t.Errorf("ReclaimAll moved %d resources, want 2 (cam1, cam2)", len(moved))
	}
	for id, want := range map[string]wire.ResourceState{"cam1": wire.ResourceAvailable, "cam2": wire.ResourceFault, "cam3": wire.ResourceAvailable} {
		if got := resourceOf(t, r, id).State; got != want {
			t.Errorf("%s state = %s, want %s", id, got, want)
		}
	}
	for _, id := range []string{"cam1", "cam2", "plain"} {
		evs := waitEvents(t, env, wire.EventLeaseRevoked, id, 1)
		if len(evs) != 1 || evs[0].Level != wire.LevelWarn {
			t.Errorf("LEASE_REVOKED events for %s = %+v, want one at warn", id, evs)
		}
	}
	if evs := auditEvents(t, env, wire.EventLeaseExpired, "cam1"); len(evs) != 0 {
		t.Errorf("LEASE_EXPIRED events = %d, want none (a revoke is not an expiry)", len(evs))
	}
}
