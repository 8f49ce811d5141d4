package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/lease"
)

// putRaw writes value under key in bucket as any client can: a plain put,
// without a TTL.
func putRaw(t *testing.T, env *brokertest.Env, bucket, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := env.JS.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, key, []byte(value)); err != nil {
		t.Fatal(err)
	}
}

// TestNoValueMakesALeaseEternal: lease values without the broker's TTL
// (garbage, an empty object, a forged owner) hold nothing: the keeper
// deletes them on its scan with nobody contending, each quarantined once.
func TestNoValueMakesALeaseEternal(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	forged := map[string]string{
		"cam1": "garbage",
		"cam2": "{}",
		"cam3": `{"resource":"cam3","owner":"mallory","ttl":"30s","expires_at":"2099-01-01T00:00:00Z"}`,
	}
	for k, v := range forged {
		putRaw(t, env, wire.BucketLeases, k, v)
	}
	startKeeper(t, env, lease.KeeperConfig{ScanInterval: 200 * time.Millisecond})
	ctx := leaseCtx(t)
	b, err := env.JS.KeyValue(ctx, wire.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	check.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		for k := range forged {
			if _, err := b.Get(ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("lease %s = %v, want it deleted", k, err)
			}
		}
		return nil
	})
	check.For(t, 10*time.Second, 100*time.Millisecond, func() error {
		for k := range forged {
			if n := len(auditEvents(t, env, wire.EventValueQuarantined, k)); n != 1 {
				return fmt.Errorf("VALUE_QUARANTINED events about %s = %d, want 1", k, n)
			}
		}
		return nil
	})
}

// TestBadResourceValue: a resource whose value is garbage is listed and
// refused as FAULT, and an operator's enable writes a valid one over it.
func TestBadResourceValue(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t)
	putRaw(t, env, wire.BucketResources, "cam1", "garbage")
	list, err := r.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "cam1" || list[0].State != wire.ResourceFault {
		t.Fatalf("List = %+v, %v; want cam1 as FAULT", list, err)
	}
	if _, err := r.Lease(ctx, "cam1", "alice", 5*time.Second); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("Lease of a garbage resource = %v, want ErrUnavailable", err)
	}
	if res, err := r.Enable(ctx, "cam1", "fixed"); err != nil || res.State != wire.ResourceAvailable {
		t.Fatalf("Enable = %+v, %v; want AVAILABLE", res, err)
	}
	h, err := r.Lease(ctx, "cam1", "alice", 5*time.Second)
	if err != nil {
		t.Fatalf("Lease after enable = %v", err)
	}
	if err := h.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(auditEvents(t, env, wire.EventValueQuarantined, "cam1")); n != 1 {
		t.Errorf("VALUE_QUARANTINED events = %d, want 1 (one bad value, reported once)", n)
	}
}
