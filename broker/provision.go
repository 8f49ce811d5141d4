package broker

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
)

// ProvisionConfig tunes what Provision creates.
type ProvisionConfig struct {
	// Replicas is the replica count of every stream and bucket. Defaults to
	// 0: AutoReplicas of ClusterSize, never lowering an existing stream.
	Replicas int
	// ClusterSize is the number of servers in the JetStream cluster.
	// Defaults to 1.
	ClusterSize int
	// AuditSources are JetStream domains (leaf brokers) whose GANTRY_AUDIT
	// this GANTRY_AUDIT sources, so that their events reach this side's
	// auditd once each, whenever the link is up. Defaults to none.
	AuditSources []string
	// Follow, when set, waits up to this long for another cluster member
	// (the meta leader) to provision the same settings first, so that the
	// members starting together do not send the same requests at once.
	// Defaults to 0: provision at once.
	Follow time.Duration
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
			Description: "gantry tasks: gantry.tasks.<queue>.<type>, sorted by priority to gantry.ready.<queue>.<type>, kept for review on gantry.review.<id>",
			Subjects:    []string{wire.SubjectTasksAll, wire.SubjectReadyAll, wire.SubjectReviewAll},
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
			Sources:     auditSources(pc.AuditSources),
		},
	}
}

// auditSources are the leaf domains' audit streams, sourced across the
// leaf link through their domains' JetStream API.
func auditSources(domains []string) []*jetstream.StreamSource {
	var out []*jetstream.StreamSource
	for _, d := range domains {
		out = append(out, &jetstream.StreamSource{Name: wire.StreamAudit,
			External: &jetstream.ExternalStream{APIPrefix: "$JS." + d + ".API"}})
	}
	return out
}

// AutoReplicas is the replica count of a cluster of size servers: 3 from
// three servers on, so a stream survives the loss of one; 1 below.
func AutoReplicas(size int) int {
	if size >= 3 {
		return 3
	}
	return 1
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
	pc.Replicas = cmp.Or(pc.Replicas, AutoReplicas(pc.ClusterSize))
	pc.AuditMaxAge = cmp.Or(pc.AuditMaxAge, 7*24*time.Hour)
	pc.TaskDedupeWindow = cmp.Or(pc.TaskDedupeWindow, 24*time.Hour)
	return pc
}

// Provision creates or updates every stream and KV bucket gantry needs. It
// is idempotent: running it again on a provisioned server changes nothing,
// and a changed setting is applied as an update (a bucket created without
// per-key TTLs gets them, keeping its keys; a stream's replicas are raised
// in place). Every member of a cluster may run it at once. Each stream
// carries a fingerprint of its settings in its metadata, so a stream
// already provisioned the same way is left alone.
func Provision(ctx context.Context, nc *nats.Conn, pc ProvisionConfig) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	auto := pc.Replicas == 0
	follow := time.Now().Add(pc.Follow)
	for _, sc := range Streams(pc) {
		if err := retry(ctx, func(ctx context.Context) error {
			if auto {
				sc.Replicas = keepReplicas(ctx, js, sc.Name, sc.Replicas)
			}
			sc.Metadata = nil
			sc.Metadata = fingerprint(sc)
			if provisioned(ctx, js, sc.Name, sc.Metadata, follow) {
				return nil
			}
			_, err := js.CreateOrUpdateStream(ctx, sc)
			return err
		}); err != nil {
			return fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
	}
	for _, bc := range Buckets(pc) {
		if err := retry(ctx, func(ctx context.Context) error {
			if auto {
				bc.Replicas = keepReplicas(ctx, js, "KV_"+bc.Bucket, bc.Replicas)
			}
			bc.Metadata = nil
			bc.Metadata = fingerprint(bc)
			if provisioned(ctx, js, "KV_"+bc.Bucket, bc.Metadata, follow) {
				return nil
			}
			_, err := js.CreateOrUpdateKeyValue(ctx, bc)
			return err
		}); err != nil {
			return fmt.Errorf("provision bucket %s: %w", bc.Bucket, err)
		}
	}
	return nil
}

// provisionKey is the metadata key of a stream's settings fingerprint.
const provisionKey = "gantry_provision"

// fingerprint returns metadata naming a hash of cfg (whose own metadata
// is unset).
func fingerprint(cfg any) map[string]string {
	data, _ := json.Marshal(cfg)
	sum := sha256.Sum256(data)
	return map[string]string{provisionKey: hex.EncodeToString(sum[:8])}
}

// provisioned reports whether stream exists with the fingerprint in want,
// waiting until follow for another member to provision it.
func provisioned(ctx context.Context, js jetstream.JetStream, stream string, want map[string]string, follow time.Time) bool {
	for {
		if s, err := js.Stream(ctx, stream); err == nil && s.CachedInfo().Config.Metadata[provisionKey] == want[provisionKey] {
			return true
		}
		if time.Now().After(follow) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// keepReplicas returns want, or the stream's replicas when it has more: a
// broker that sees fewer servers (one starting alone) never lowers them.
func keepReplicas(ctx context.Context, js jetstream.JetStream, stream string, want int) int {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return want
	}
	return max(want, s.CachedInfo().Config.Replicas)
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

// transient reports whether err may pass on its own: a time-out, no
// JetStream yet, a cluster still placing peers, or another member that
// created the stream between this one's update and create.
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamNameInUse, errCodeClusterNotAvailable, errCodeInsufficientResources, errCodeNoSuitablePeers:
		return true
	}
	return false
}

// JetStream error codes a cluster answers while it forms.
const (
	errCodeNoSuitablePeers       jetstream.ErrorCode = 10005
	errCodeClusterNotAvailable   jetstream.ErrorCode = 10008
	errCodeInsufficientResources jetstream.ErrorCode = 10023
)
