package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
)

// ProvisionConfig tunes what Provision creates.
type ProvisionConfig struct {
	// Replicas is the replica count of every stream and bucket. Defaults to 1.
	Replicas int
	// AuditMaxAge bounds how long the audit stream keeps events; auditd's
	// Pebble store is the long-term record. Defaults to 7 days.
	AuditMaxAge time.Duration
	// TaskDedupeWindow is how long a task's Nats-Msg-Id (or key) suppresses
	// a duplicate publish. Defaults to 24 hours.
	TaskDedupeWindow time.Duration
}

// Streams returns the stream configurations gantry needs.
func Streams(pc ProvisionConfig) []jetstream.StreamConfig {
	pc = pc.withDefaults()
	return []jetstream.StreamConfig{
		{
			Name:        wire.StreamTasks,
			Description: "gantry tasks: gantry.tasks.<queue>.<type>, sorted by priority to gantry.ready.<queue>.<type>",
			Subjects:    []string{wire.SubjectTasksAll, wire.SubjectReadyAll},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    pc.Replicas,
			Duplicates:  pc.TaskDedupeWindow,
			AllowMsgTTL: true,
		},
		{
			Name:        wire.StreamAudit,
			Description: "gantry audit events: gantry.audit.<kind>.<verb>",
			Subjects:    []string{wire.SubjectAuditAll},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    pc.Replicas,
			MaxAge:      pc.AuditMaxAge,
		},
	}
}

// Buckets returns the KV bucket configurations gantry needs.
func Buckets(pc ProvisionConfig) []jetstream.KeyValueConfig {
	pc = pc.withDefaults()
	kv := func(name, desc string, history uint8, markerTTL time.Duration) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{
			Bucket:         name,
			Description:    desc,
			History:        history,
			Storage:        jetstream.FileStorage,
			Replicas:       pc.Replicas,
			LimitMarkerTTL: markerTTL,
		}
	}
	return []jetstream.KeyValueConfig{
		kv(wire.BucketLeases, "resource leases (per-key TTL, compare-and-swap)", 1, time.Minute),
		kv(wire.BucketResources, "resources and their state", 5, 0),
		kv(wire.BucketRoutes, "egress routes and their health", 1, 0),
		kv(wire.BucketJobs, "scheduled jobs", 5, 0),
		// Per-key TTL: the records of ended tasks expire (kv.TaskStore).
		kv(wire.BucketTasks, "task state by task id (ended tasks expire)", 1, time.Minute),
		kv(wire.BucketCheckpoints, "task checkpoints and operation keys", 1, time.Minute),
		kv(wire.BucketScheduler, "scheduler leader lease and last fire times", 1, time.Minute),
		// Per-key TTL: a dead waiter's place in line lapses.
		kv(wire.BucketWaiters, "places in line for busy resources (per-key TTL)", 1, time.Minute),
		kv(wire.BucketQueues, "queue pauses", 1, 0),
		// Per-key TTL: a worker that stops heartbeating disappears.
		kv(wire.BucketWorkers, "live workers (per-key TTL)", 1, time.Minute),
	}
}

func (pc ProvisionConfig) withDefaults() ProvisionConfig {
	pc.Replicas = cmp.Or(pc.Replicas, 1)
	pc.AuditMaxAge = cmp.Or(pc.AuditMaxAge, 7*24*time.Hour)
	pc.TaskDedupeWindow = cmp.Or(pc.TaskDedupeWindow, 24*time.Hour)
	return pc
}

// Provision creates or updates every stream and KV bucket gantry needs. It
// is idempotent: running it again on a provisioned server changes nothing,
// and a changed setting is applied as an update (a bucket created without
// per-key TTLs gets them, keeping its keys).
func Provision(ctx context.Context, nc *nats.Conn, pc ProvisionConfig) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	for _, sc := range Streams(pc) {
		if err := retry(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateStream(ctx, sc)
			return err
		}); err != nil {
			return fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
	}
	for _, bc := range Buckets(pc) {
		if err := retry(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, bc)
			return err
		}); err != nil {
			return fmt.Errorf("provision bucket %s: %w", bc.Bucket, err)
		}
	}
	return nil
}

// retry runs op with short per-try deadlines until it succeeds, fails for a
// reason other than a time-out, or ctx ends: on a fresh cluster, JetStream
// API calls made before a meta leader exists hang until their deadline.
func retry(ctx context.Context, op func(context.Context) error) error {
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := op(tctx)
		cancel()
		if err == nil {
			return nil
		}
		if !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}
