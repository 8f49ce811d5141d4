package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/lease"
)

// Lease is the lease scenario's result: one client acquiring and releasing
// a lease in a loop (the lease store as `gantry lease acquire|release` and
// the workers use it, with its RESOURCE_LEASED and RESOURCE_RELEASED
// events, flushed before the clock stops), against KV puts of a lease-sized
// value into a scratch bucket, each for the same duration.
type Lease struct {
	Cycles Rate `json:"cycles"`
	// Events counts this run's RESOURCE_LEASED and RESOURCE_RELEASED seen
	// on gantry.audit.resource.> (two a cycle).
	Events  int  `json:"events"`
	RawPuts Rate `json:"raw_kv_puts"`
	// Ratio is Cycles.PerSec / RawPuts.PerSec.
	Ratio float64 `json:"ratio"`
}

// Lease runs the lease scenario for d each side.
func (r *Run) Lease(ctx context.Context, d time.Duration) (*Lease, error) {
	if d <= 0 {
		return nil, fmt.Errorf("lease: want a duration > 0, got %v", d)
	}
	raw, err := r.rawPuts(ctx, d)
	if err != nil {
		return nil, err
	}
	resource := "bench-" + r.id
	var events atomic.Int64
	sub, err := r.cfg.Conn.Subscribe(wire.SubjectAuditPrefix+".resource.>", func(m *nats.Msg) {
		var ev struct {
			Type       wire.EventType `json:"type"`
			ResourceID string         `json:"resource_id"`
		}
		if json.Unmarshal(m.Data, &ev) == nil && ev.ResourceID == resource &&
			(ev.Type == wire.EventResourceLeased || ev.Type == wire.EventResourceReleased) {
			events.Add(1)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to resource events: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	if err := r.cfg.Conn.Flush(); err != nil {
		return nil, err
	}
	leases, err := lease.NewLeases(r.js, lease.LeasesConfig{Audit: audit.NewEmitter(r.js, "bench", nil)})
	if err != nil {
		return nil, err
	}
	cycles := 0
	start := time.Now()
	for time.Since(start) < d {
		l, err := leases.Acquire(ctx, resource, resource, 30*time.Second)
		if err != nil {
			return nil, fmt.Errorf("acquire: %w", err)
		}
		if err := leases.Release(ctx, l); err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
		cycles++
		if cycles%100 == 0 {
			r.cfg.Progress(Progress{Phase: "lease cycles", Done: int(time.Since(start) / time.Millisecond), Total: int(d / time.Millisecond)})
		}
	}
	if err := leases.Flush(ctx); err != nil {
		return nil, fmt.Errorf("flush lease events: %w", err)
	}
	res := &Lease{Cycles: rate(cycles, time.Since(start)), RawPuts: raw}
	res.Ratio = ratio(res.Cycles.PerSec, raw.PerSec)
	// The events are stored; their copies on the subscription follow.
	if !r.poll(ctx, r.cfg.Timeout, func() bool { return events.Load() >= int64(2*cycles) }) {
		return nil, fmt.Errorf("lease events: %d of %d seen", events.Load(), 2*cycles)
	}
	res.Events = int(events.Load())
	return res, nil
}

// rawPuts puts a lease-sized value under one key of a scratch bucket for d.
func (r *Run) rawPuts(ctx context.Context, d time.Duration) (Rate, error) {
	name := "gantry_bench_" + r.id
	kv, err := r.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, Storage: jetstream.FileStorage})
	if err != nil {
		return Rate{}, fmt.Errorf("create scratch bucket %s: %w", name, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.js.DeleteKeyValue(dctx, name); err != nil {
			r.cfg.Log.Warn("delete scratch bucket", "bucket", name, "err", err)
		}
	}()
	value := []byte(`{"resource":"bench","owner":"bench","expires_at":"2026-11-30T00:00:00Z","ttl":"30s"}`)
	puts := 0
	start := time.Now()
	for time.Since(start) < d {
		if _, err := kv.Put(ctx, "bench", value); err != nil {
			return Rate{}, fmt.Errorf("raw put: %w", err)
		}
		puts++
		if puts%100 == 0 {
			r.cfg.Progress(Progress{Phase: "raw KV puts", Done: int(time.Since(start) / time.Millisecond), Total: int(d / time.Millisecond)})
		}
	}
	return rate(puts, time.Since(start)), nil
}
