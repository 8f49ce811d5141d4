package lease

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/kv"
)

// RevokeAll deletes every lease in the bucket, whoever holds it and however
// long it has left (cooldowns included), and records each as a
// LEASE_REVOKED event with reason. It is for a restored system: no lease
// from before a backup may be honoured after it is restored. A live system
// never takes a lease from its holder: nothing else calls it.
//
// Each lease is deleted at the revision read (as its holder would release
// it), so the keeper sees a release, not an expiry; a lease written in
// between is left alone and reported as an error. An undecodable value is
// deleted too.
func (l *Leases) RevokeAll(ctx context.Context, reason string) ([]wire.Lease, error) {
	entries, err := kv.Entries(ctx, l.kv, "")
	if err != nil {
		return nil, fmt.Errorf("revoke leases: %w", err)
	}
	revoked := make([]wire.Lease, 0, len(entries))
	for _, e := range entries {
		lease, _, err := decodeLease(e)
		if err != nil {
			lease = wire.Lease{Resource: e.Key(), Revision: e.Revision()}
		}
		msg := nats.NewMsg(l.prefix + e.Key())
		msg.Header.Set(kvOperationHeader, "DEL")
		if _, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(e.Revision())); err != nil {
			return revoked, fmt.Errorf("revoke lease %s: %w", e.Key(), err)
		}
		l.ev.emit(wire.Event{
			Type: wire.EventLeaseRevoked, ResourceID: e.Key(), Level: wire.LevelWarn,
			Message: fmt.Sprintf("lease of %s on %s revoked: %s", lease.Owner, e.Key(), reason),
			Payload: audit.Payload(map[string]any{"owner": lease.Owner, "expires_at": lease.ExpiresAt,
				"revision": lease.Revision, "reason": reason}),
		})
		revoked = append(revoked, lease)
	}
	return revoked, nil
}

// ReclaimAll settles every resource left LEASED, RUNNING or COOLDOWN
// without its lease, as Reclaim settles one (each move a
// RESOURCE_STATE_CHANGED event with reason), and returns those it moved.
// An undecodable resource is skipped.
func (r *Resources) ReclaimAll(ctx context.Context, reason string) ([]Resource, error) {
	entries, err := kv.Entries(ctx, r.kv, "")
	if err != nil {
		return nil, fmt.Errorf("reclaim resources: %w", err)
	}
	var moved []Resource
	for _, e := range entries {
		var res wire.Resource
		if err := json.Unmarshal(e.Value(), &res); err != nil {
			r.log.Warn("skipping undecodable resource", "resource_id", e.Key(), "err", err)
			continue
		}
		switch res.State {
		case wire.ResourceLeased, wire.ResourceRunning, wire.ResourceCooldown:
		default:
			continue
		}
		got, ok, err := r.Reclaim(ctx, e.Key(), reason)
		if err != nil {
			return moved, err
		}
		if ok {
			moved = append(moved, got)
		}
	}
	return moved, nil
}
