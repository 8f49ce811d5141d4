package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
)

// The fuzz targets of the lease buckets write any bytes, as any client
// can, into a key of a real broker's bucket and read it back through the
// store (docs/RELIABILITY.md, "Fuzzing").

// FuzzLeaseValue: whatever a lease key holds, with or without a TTL, Get
// answers a lease, ErrNotFound or a bad value, and no value holds the
// resource forever: without a TTL, Acquire takes it.
func FuzzLeaseValue(f *testing.F) {
	f.Add([]byte(`{"resource":"fz","owner":"a","expires_at":"2026-12-01T00:00:00Z","ttl":"1s"}`), uint8(0))
	f.Add([]byte(`{"resource":"fz","owner":"a","ttl":"1s"}`), uint8(1))
	f.Add([]byte(`{}`), uint8(0))
	f.Add([]byte(`garbage`), uint8(2))
	env := brokertest.Start(f)
	l, err := lease.NewLeases(env.JS, lease.LeasesConfig{Audit: audit.NewEmitter(env.JS, "fuzz", nil)})
	if err != nil {
		f.Fatal(err)
	}
	stream, err := env.JS.Stream(context.Background(), "KV_"+wire.BucketLeases)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, ttl uint8) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		msg := nats.NewMsg("$KV." + wire.BucketLeases + ".fz")
		msg.Data = data
		var opts []jetstream.PublishOpt
		if ttl > 0 {
			opts = append(opts, jetstream.WithMsgTTL(time.Duration(ttl)*time.Hour))
		}
		if _, err := env.JS.PublishMsg(ctx, msg, opts...); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Get(ctx, "fz"); err != nil && !errors.Is(err, kv.ErrBadValue) && !errors.Is(err, lease.ErrNotFound) {
			t.Fatalf("Get = %v, want a lease, ErrNotFound or ErrBadValue", err)
		}
		if _, err := l.List(ctx); err != nil {
			t.Fatalf("List = %v", err)
		}
		got, err := l.Acquire(ctx, "fz", "fuzzer", time.Second)
		switch {
		case err == nil:
			if err := l.Release(ctx, got); err != nil {
				t.Fatalf("Release = %v", err)
			}
		case ttl > 0 && errors.Is(err, lease.ErrConflict):
		default:
			t.Fatalf("Acquire over %q (ttl %dh) = %v, want the lease", data, ttl, err)
		}
		if err := stream.Purge(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzResourceValue: whatever a resource key holds, Get and List answer
// (a bad value as a FAULT stand-in, not an error that hides the rest).
func FuzzResourceValue(f *testing.F) {
	f.Add([]byte(`{"id":"fz","state":"AVAILABLE"}`))
	f.Add([]byte(`{"id":"fz","state":"LEASED","lease_owner":"a","reclaim":"fault"}`))
	f.Add([]byte(`{"state":"NOPE"}`))
	f.Add([]byte(`[1,2`))
	env := brokertest.Start(f)
	r := newResources(f, env)
	b, err := env.JS.KeyValue(context.Background(), wire.BucketResources)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Put(ctx, "fz", data); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Get(ctx, "fz"); err != nil {
			t.Fatalf("Get over %q = %v", data, err)
		}
		list, err := r.List(ctx)
		if err != nil {
			t.Fatalf("List over %q = %v", data, err)
		}
		if len(list) != 1 {
			t.Fatalf("List over %q = %d resources, want 1", data, len(list))
		}
	})
}
