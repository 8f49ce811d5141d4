package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// Presence is the typed store of wire.BucketWorkers: one WorkerInfo per
// live worker process, each written with a per-key TTL that its next
// heartbeat restarts, so that a killed worker's entry lapses by itself.
type Presence struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
}

// NewPresence opens the workers bucket, which the broker provisions.
func NewPresence(ctx context.Context, js jetstream.JetStream) (*Presence, error) {
	b, err := kv.Open(ctx, js, wire.BucketWorkers)
	if err != nil {
		return nil, err
	}
	return &Presence{js: js, kv: b}, nil
}

// Put writes info under its worker's key, to lapse after ttl (whole
// seconds, at least 1 s) unless written again.
func (p *Presence) Put(ctx context.Context, info wire.WorkerInfo, ttl time.Duration) error {
	data, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("encode worker %s: %w", info.Name, err)
	}
	if _, err := p.js.PublishMsg(ctx, kv.Msg(wire.BucketWorkers, wire.WorkerKey(info.Name), data, ttl)); err != nil {
		return fmt.Errorf("put worker %s: %w", info.Name, err)
	}
	return nil
}

// Delete removes worker name's entry: a worker that stops cleanly leaves
// at once.
func (p *Presence) Delete(ctx context.Context, name string) error {
	if err := p.kv.Delete(ctx, wire.WorkerKey(name)); err != nil {
		return fmt.Errorf("delete worker %s: %w", name, err)
	}
	return nil
}

// List returns the live workers, by name. An entry that is not a
// WorkerInfo is skipped.
func (p *Presence) List(ctx context.Context) ([]wire.WorkerInfo, error) {
	out, err := kv.List(ctx, p.kv, func(e jetstream.KeyValueEntry) (wire.WorkerInfo, bool) {
		var w wire.WorkerInfo
		err := json.Unmarshal(e.Value(), &w)
		return w, err == nil && w.Name != ""
	}, func(a, b wire.WorkerInfo) int { return strings.Compare(a.Name, b.Name) })
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	return out, nil
}
