package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
)

// setupLeases starts a broker and returns a lease store on it.
func setupLeases(t *testing.T) (*brokertest.Env, *lease.Leases) {
	t.Helper()
	env := brokertest.Start(t)
	l, err := lease.NewLeases(env.JS, lease.LeasesConfig{Audit: audit.NewEmitter(env.JS, "test", nil), Logger: env.Log})
	if err != nil {
		t.Fatal(err)
	}
	return env, l
}

func leaseCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAcquireConflictRelease(t *testing.T) {
	t.Parallel()
	_, l := setupLeases(t)
	ctx := leaseCtx(t)
	a, err := l.Acquire(ctx, "cam1", "alice", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.Owner != "alice" || a.Revision == 0 {
		t.Errorf("lease = %+v, want owner alice and a revision", a)
	}
	_, err = l.Acquire(ctx, "cam1", "bob", 10*time.Second)
	var ce *lease.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, lease.ErrConflict) {
		t.Fatalf("second acquire err = %v, want a *ConflictError", err)
	}
	if ce.Holder != "alice" || !ce.ExpiresAt.Equal(a.ExpiresAt) {
		t.Errorf("conflict = %+v, want holder alice expiring %v", ce, a.ExpiresAt)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, "cam1", "bob", 10*time.Second)
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if err := l.Release(ctx, a); !errors.Is(err, lease.ErrLost) || !errors.Is(err, lease.ErrConflict) {
		t.Errorf("stale release err = %v, want ErrLost and ErrConflict", err)
	}
	got, err := l.Get(ctx, "cam1")
	if err != nil || got.Owner != "bob" || got.Revision != b.Revision {
		t.Errorf("Get = %+v, %v; want bob's lease at revision %d", got, err, b.Revision)
	}
}

func TestHundredRoundsOneWinner(t *testing.T) {
	t.Parallel()
	_, l := setupLeases(t)
	ctx := leaseCtx(t)
	for round := range 100 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		wins := make(chan string, 2)
		for _, owner := range []string{"a", "b"} {
			wg.Go(func() {
				<-start
				got, err := l.Acquire(ctx, "dev", owner, 5*time.Second)
				switch {
				case err == nil:
					wins <- got.Owner
				case !errors.Is(err, lease.ErrConflict):
					t.Errorf("round %d: acquire %s: %v", round, owner, err)
				}
			})
		}
		close(start)
		wg.Wait()
		close(wins)
		var winners []string
		for w := range wins {
			winners = append(winners, w)
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: winners = %v, want exactly one", round, winners)
		}
		cur, err := l.Get(ctx, "dev")
		if err != nil || cur.Owner != winners[0] {
			t.Fatalf("round %d: holder = %+v, %v; want %s", round, cur, err, winners[0])
		}
		if err := l.Release(ctx, cur); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHolderRenewsPastTTL(t *testing.T) {
	t.Parallel()
	_, l := setupLeases(t)
	ctx := leaseCtx(t)
	h, err := l.Hold(ctx, "cam1", "alice", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Hold for several TTLs: every check, the lease is alice's and bob is
	// refused.
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		if err := h.Err(); err != nil {
			t.Fatalf("holder context ended: %v", err)
		}
		if _, err := l.Acquire(ctx, "cam1", "bob", time.Second); !errors.Is(err, lease.ErrConflict) {
			t.Fatalf("bob's acquire while alice holds: err = %v, want ErrConflict", err)
		}
		time.Sleep(200 * time.Millisecond) // the span of several TTLs is what is observed, not a wait
	}
	if got := h.Lease().Revision; got <= 1 {
		t.Errorf("lease revision = %d, want renewals to have moved it", got)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h.Context().Err() == nil {
		t.Error("holder context alive after Release")
	}
	// A waiter takes it over at once.
	if _, err := l.Acquire(ctx, "cam1", "bob", time.Second); err != nil {
		t.Errorf("bob's acquire right after release: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
}

func TestLapseThenNextContender(t *testing.T) {
	t.Parallel()
	_, l := setupLeases(t)
	ctx := leaseCtx(t)
	a, err := l.Acquire(ctx, "cam1", "alice", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check.That(t, 10*time.Second, "bob gets the lapsed lease", func() bool {
		_, err := l.Acquire(ctx, "cam1", "bob", 5*time.Second)
		if err != nil && !errors.Is(err, lease.ErrConflict) {
			t.Fatal(err)
		}
		return err == nil
	})
	if _, err := l.Renew(ctx, a, time.Second); !errors.Is(err, lease.ErrLost) {
		t.Errorf("alice's renew after lapse: err = %v, want ErrLost", err)
	}
	if err := l.Release(ctx, a); !errors.Is(err, lease.ErrLost) {
		t.Errorf("alice's release after lapse: err = %v, want ErrLost", err)
	}
	cur, err := l.Get(ctx, "cam1")
	if err != nil || cur.Owner != "bob" {
		t.Errorf("holder = %+v, %v; want bob untouched", cur, err)
	}
}

func TestNonHolderChangesNothing(t *testing.T) {
	t.Parallel()
	_, l := setupLeases(t)
	ctx := leaseCtx(t)
	old, err := l.Acquire(ctx, "cam1", "bob", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	a, err := l.Acquire(ctx, "cam1", "alice", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for name, ls := range map[string]wire.Lease{
		"stale lease":    old,
		"wrong revision": {Resource: "cam1", Owner: "bob", Revision: a.Revision + 10},
		"no revision":    {Resource: "cam1", Owner: "bob"},
	} {
		if _, err := l.Renew(ctx, ls, time.Second); !errors.Is(err, lease.ErrLost) {
			t.Errorf("renew with %s: err = %v, want ErrLost", name, err)
		}
		if err := l.Release(ctx, ls); !errors.Is(err, lease.ErrLost) {
			t.Errorf("release with %s: err = %v, want ErrLost", name, err)
		}
	}
	cur, err := l.Get(ctx, "cam1")
	if err != nil || cur.Owner != a.Owner || cur.Revision != a.Revision || !cur.ExpiresAt.Equal(a.ExpiresAt) {
		t.Errorf("lease = %+v, %v; want alice's %+v untouched", cur, err, a)
	}
}

func TestHolderContextCancelledWhenLost(t *testing.T) {
	t.Parallel()
	env, l := setupLeases(t)
	ctx := leaseCtx(t)
	h, err := l.Hold(ctx, "cam1", "alice", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := env.JS.KeyValue(ctx, wire.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	// An operator purges the key: the next renewal must find it lost.
	if err := bucket.Purge(ctx, "cam1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("holder context still alive after the lease was purged")
	}
	if err := h.Err(); !errors.Is(err, lease.ErrLost) {
		t.Errorf("holder Err = %v, want ErrLost", err)
	}
	if err := h.Release(ctx); !errors.Is(err, lease.ErrLost) {
		t.Errorf("Release after loss = %v, want ErrLost", err)
	}
}

func TestLeaseTTLAndValidation(t *testing.T) {
	t.Parallel()
	for in, want := range map[time.Duration]time.Duration{
		time.Millisecond: time.Second, 1500 * time.Millisecond: 2 * time.Second, 30 * time.Second: 30 * time.Second,
	} {
		if got, err := lease.TTL(in); err != nil || got != want {
			t.Errorf("LeaseTTL(%v) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []time.Duration{0, -time.Second} {
		if _, err := lease.TTL(bad); !errors.Is(err, kv.ErrInvalid) {
			t.Errorf("LeaseTTL(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	_, l := setupLeases(t)
	ctx := leaseCtx(t)
	for _, bad := range []string{"", "a.b", "a b", "*", "cam>"} {
		if _, err := l.Acquire(ctx, bad, "alice", time.Second); !errors.Is(err, kv.ErrInvalid) {
			t.Errorf("Acquire(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := l.Acquire(ctx, "cam1", "", time.Second); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Acquire without owner = %v, want ErrInvalid", err)
	}
	if _, err := l.Acquire(ctx, "cam1", "alice", -time.Second); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Acquire with a negative ttl = %v, want ErrInvalid", err)
	}
	// Nothing invalid was taken.
	if list, err := l.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("List after invalid acquires = %v, %v; want empty", list, err)
	}
	if _, err := lease.NewLeases(nil, lease.LeasesConfig{}); err == nil {
		t.Error("NewLeases(nil) = nil error")
	}
}

func TestLeaseEvents(t *testing.T) {
	t.Parallel()
	env, l := setupLeases(t)
	ctx := leaseCtx(t)
	a, err := l.Acquire(ctx, "cam1", "alice", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "cam1", "bob", 5*time.Second); !errors.Is(err, lease.ErrConflict) {
		t.Fatalf("bob's acquire while alice holds = %v, want ErrConflict", err)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []wire.EventType{wire.EventResourceLeased, wire.EventLeaseConflict, wire.EventResourceReleased} {
		if evs := auditEvents(t, env, typ, "cam1"); len(evs) != 1 {
			t.Errorf("%s events = %d, want 1", typ, len(evs))
		}
	}
	list, err := l.List(ctx)
	if err != nil || len(list) != 0 {
		t.Errorf("List after release = %v, %v; want empty", list, err)
	}
}

func TestHolderStopsWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	env, l := setupLeases(t)
	ctx := leaseCtx(t)
	h, err := l.Hold(ctx, "cam1", "alice", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The broker goes away: renewals fail, and the holder must stop work
	// before the broker could have expired the lease.
	env.Broker.Shutdown()
	select {
	case <-h.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("holder context alive 10s after the broker stopped")
	}
	if err := h.Err(); !errors.Is(err, lease.ErrLost) {
		t.Errorf("holder Err = %v, want ErrLost", err)
	}
}
