package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
	"github.com/gantry-dev/gantry/lease"
)

// startKeeper runs a keeper on env until the test ends and waits until it
// is ready.
func startKeeper(t *testing.T, env *brokertest.Env, cfg lease.KeeperConfig) *lease.Keeper {
	t.Helper()
	_, js := brokertest.Connect(t, env.URL)
	cfg.Audit = audit.NewEmitter(js, "keeper", nil)
	cfg.Logger = env.Log.With("component", "kv")
	k, err := lease.NewKeeper(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Go(func() { errc <- k.Run(context.Background()) })
	t.Cleanup(func() {
		k.Stop()
		k.Stop()
		wg.Wait()
		if err := <-errc; err != nil {
			t.Errorf("keeper Run = %v, want nil after Stop", err)
		}
	})
	select {
	case <-k.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("keeper not ready within 10s")
	}
	return k
}

func TestKeeperRegistersKeepingState(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	if _, err := r.Disable(ctx, "cam1", "maintenance"); err != nil {
		t.Fatal(err)
	}
	startKeeper(t, env, lease.KeeperConfig{Resources: []lease.ResourceSpec{{ID: "cam1", Route: "office"}, {ID: "cam2"}}})
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceDisabled || res.RouteID != "office" {
		t.Errorf("cam1 = %+v, want DISABLED kept and route office", res.Resource)
	}
	if res := resourceOf(t, r, "cam2"); res.State != wire.ResourceAvailable {
		t.Errorf("cam2 = %s, want AVAILABLE", res.State)
	}
}

func TestKeeperLifecycle(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	newKeeper := func(t testing.TB) *lease.Keeper {
		k, err := lease.NewKeeper(env.JS, lease.KeeperConfig{
			Audit: audit.NewEmitter(env.JS, "keeper", nil), Logger: env.Log, Resources: []lease.ResourceSpec{{ID: "cam1"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	t.Run("misuse", func(t *testing.T) {
		lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor { return newKeeper(t) })
	})
	t.Run("failed start", func(t *testing.T) {
		// A broker of its own: the resources bucket goes away between New
		// and Run, so registering cam1 fails.
		env := brokertest.Start(t)
		k, err := lease.NewKeeper(env.JS, lease.KeeperConfig{
			Audit: audit.NewEmitter(env.JS, "keeper", nil), Logger: env.Log, Resources: []lease.ResourceSpec{{ID: "cam1"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.JS.DeleteKeyValue(context.Background(), wire.BucketResources); err != nil {
			t.Fatal(err)
		}
		lifecycletest.FailedStart(t, k)
	})
}

func TestNewKeeperRejects(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	if _, err := lease.NewKeeper(env.JS, lease.KeeperConfig{}); err == nil {
		t.Error("NewKeeper without an audit emitter = nil error")
	}
	if _, err := lease.NewKeeper(env.JS, lease.KeeperConfig{Audit: audit.NewEmitter(env.JS, "k", nil), Resources: []lease.ResourceSpec{{ID: "a.b"}}}); err == nil {
		t.Error("NewKeeper with a bad resource id = nil error")
	}
}

func TestCooldownThenAvailable(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t)
	startKeeper(t, env, lease.KeeperConfig{Resources: []lease.ResourceSpec{{ID: "cam1"}}})
	rh, err := r.Lease(ctx, "cam1", "w1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := rh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rh.Finish(ctx, lease.Outcome{Cooldown: time.Second}); err != nil {
		t.Fatal(err)
	}
	res := resourceOf(t, r, "cam1")
	if res.State != wire.ResourceCooldown || res.LeaseUntil == nil {
		t.Errorf("after Finish with a cooldown: %+v, want COOLDOWN with lease_until", res.Resource)
	}
	// During the cooldown nobody gets it.
	_, err = r.Lease(ctx, "cam1", "w2", 5*time.Second)
	var ce *lease.ConflictError
	if !errors.As(err, &ce) || ce.Holder != lease.CooldownOwner("w1") {
		t.Errorf("Lease during cooldown: err = %v, want a conflict with %s", err, lease.CooldownOwner("w1"))
	}
	check.That(t, 10*time.Second, "cam1 back to AVAILABLE after its cooldown", func() bool {
		return resourceOf(t, r, "cam1").State == wire.ResourceAvailable
	})
	if _, err := r.Lease(ctx, "cam1", "w2", 5*time.Second); err != nil {
		t.Errorf("Lease after cooldown: %v", err)
	}
}

func TestLeaseExpiredRecordedOnce(t *testing.T) {
	t.Parallel()
	env, l := setupLeases(t)
	ctx := leaseCtx(t)
	// Count every publish on the subject, before the stream's dedupe.
	sub, err := env.NC.SubscribeSync(wire.EventLeaseExpired.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	startKeeper(t, env, lease.KeeperConfig{})
	startKeeper(t, env, lease.KeeperConfig{})
	if _, err := l.Acquire(ctx, "cam1", "alice", time.Second); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for len(ids) < 2 {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("published LEASE_EXPIRED events = %d, want one from each keeper: %v", len(ids), err)
		}
		var ev wire.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.ResourceID != "cam1" || ev.Payload == nil {
			t.Errorf("event = %+v, want resource cam1 with a payload", ev)
		}
		ids = append(ids, ev.ID)
	}
	if ids[0] != ids[1] {
		t.Errorf("keepers published ids %v, want the same id", ids)
	}
	if evs := auditEvents(t, env, wire.EventLeaseExpired, "cam1"); len(evs) != 1 {
		t.Errorf("stored LEASE_EXPIRED events = %d, want 1", len(evs))
	}
}

func TestReclaimAfterRestart(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "idle"}, lease.ResourceSpec{ID: "cam1"}, lease.ResourceSpec{ID: "cam2", Reclaim: lease.ReclaimFault})
	// Three holders crash (their renewals stop): cam1 LEASED, cam2 RUNNING
	// with the fault policy, idle never leased.
	crash, crashed := context.WithCancel(ctx)
	if _, err := r.Lease(crash, "cam1", "w1", time.Second); err != nil {
		t.Fatal(err)
	}
	rh2, err := r.Lease(crash, "cam2", "w2", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := rh2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	crashed()
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	env.Broker.Shutdown()
	// The leases lapse while the broker is down or soon after it is back.
	env2 := brokertest.Start(t, brokertest.WithDataDir(env.DataDir))
	r2 := newResources(t, env2)
	if got := resourceOf(t, r2, "cam2").State; got != wire.ResourceRunning {
		t.Fatalf("cam2 after restart = %s, want RUNNING (as left)", got)
	}
	startKeeper(t, env2, lease.KeeperConfig{})
	check.That(t, 10*time.Second, "cam1 AVAILABLE and cam2 FAULT", func() bool {
		return resourceOf(t, r2, "cam1").State == wire.ResourceAvailable && resourceOf(t, r2, "cam2").State == wire.ResourceFault
	})
	if res := resourceOf(t, r2, "cam2"); res.LastError == "" || res.LeaseOwner != "" {
		t.Errorf("cam2 = %+v, want a last_error and no owner", res.Resource)
	}
	if got := resourceOf(t, r2, "idle").State; got != wire.ResourceAvailable {
		t.Errorf("idle = %s, want AVAILABLE", got)
	}
	evs := waitEvents(t, env2, wire.EventResourceStateChanged, "cam2", 4)
	if last := evs[len(evs)-1]; last.Level != wire.LevelWarn {
		t.Errorf("reclaim event = %+v, want level warn for FAULT", last)
	}
}

func TestLeaseReclaimsStaleHolder(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	crash, crashed := context.WithCancel(ctx)
	rh, err := r.Lease(crash, "cam1", "w1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := rh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	crashed()
	// No keeper runs: the next taker reclaims on its own once the lease
	// lapsed.
	var rh2 *lease.ResourceHolder
	check.That(t, 10*time.Second, "w2 leases cam1 after w1's lease lapsed", func() bool {
		rh2, err = r.Lease(ctx, "cam1", "w2", 5*time.Second)
		if err != nil && !errors.Is(err, lease.ErrConflict) {
			t.Fatal(err)
		}
		return err == nil
	})
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceLeased || res.LeaseOwner != "w2" {
		t.Errorf("cam1 = %+v, want LEASED by w2", res.Resource)
	}
	// w1 comes back: it cannot finish anything.
	if err := rh.Finish(ctx, lease.Outcome{}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("w1 Finish = %v", err)
	}
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceLeased || res.LeaseOwner != "w2" {
		t.Errorf("cam1 after w1's Finish = %+v, want LEASED by w2 untouched", res.Resource)
	}
	if err := rh2.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
}

func TestKeeperPeriodicScan(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t)
	clk := clock.NewFake(time.Now())
	startKeeper(t, env, lease.KeeperConfig{Resources: []lease.ResourceSpec{{ID: "cam1"}}, Clock: clk, ScanInterval: time.Hour})
	// A resource left LEASED by a ghost, written behind every lease's back:
	// no lease event will come; only the periodic scan can find it.
	bucket, err := env.JS.KeyValue(ctx, wire.BucketResources)
	if err != nil {
		t.Fatal(err)
	}
	ghost, err := json.Marshal(wire.Resource{ID: "cam1", State: wire.ResourceLeased, LeaseOwner: "ghost", UpdatedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Put(ctx, "cam1", ghost); err != nil {
		t.Fatal(err)
	}
	check.That(t, 10*time.Second, "keeper armed its scan timer", func() bool { return clk.Timers() > 0 })
	if got := resourceOf(t, r, "cam1").State; got != wire.ResourceLeased {
		t.Fatalf("cam1 before the scan = %s, want LEASED", got)
	}
	clk.Advance(time.Hour)
	check.That(t, 10*time.Second, "the scan reclaims cam1", func() bool {
		return resourceOf(t, r, "cam1").State == wire.ResourceAvailable
	})
}
