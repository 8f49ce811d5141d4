package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// ErrNotFound is returned for a route id that gantry_routes does not
// hold. It matches kv.ErrNotFound.
var ErrNotFound = kv.Sentinel("route not found", kv.ErrNotFound)

// Store is the typed view of the gantry_routes bucket: one wire.Route
// per key, keyed by route id. healthd writes it; workers and the CLI read
// it.
type Store struct {
	kv jetstream.KeyValue
}

// NewStore binds the gantry_routes bucket, which the broker
// provisions.
func NewStore(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	b, err := kv.Open(ctx, js, wire.BucketRoutes)
	if err != nil {
		return nil, err
	}
	return &Store{kv: b}, nil
}

// Get returns route id and the revision it was read at.
func (s *Store) Get(ctx context.Context, id string) (wire.Route, uint64, error) {
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return wire.Route{}, 0, fmt.Errorf("route %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return wire.Route{}, 0, fmt.Errorf("get route %q: %w", id, err)
	}
	var r wire.Route
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return wire.Route{}, 0, fmt.Errorf("route %q: %w", id, kv.BadValue(wire.BucketRoutes, id, e.Revision(), err))
	}
	return r, e.Revision(), nil
}

// Put writes r under its id and returns the new revision.
func (s *Store) Put(ctx context.Context, r wire.Route) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode route %q: %w", r.ID, err)
	}
	rev, err := s.kv.Put(ctx, r.ID, data)
	if err != nil {
		return 0, fmt.Errorf("put route %q: %w", r.ID, err)
	}
	return rev, nil
}

// List returns every route, sorted by id. It reads the bucket in one pass
// (a watch up to its current end) rather than one request per key. A value
// that is not a route is listed as a FAULT route whose last error says so,
// rather than failing the list.
func (s *Store) List(ctx context.Context) ([]wire.Route, error) {
	out, err := kv.List(ctx, s.kv, func(e jetstream.KeyValueEntry) (wire.Route, bool) {
		var r wire.Route
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			bad := kv.BadValue(wire.BucketRoutes, e.Key(), e.Revision(), err)
			r = wire.Route{ID: e.Key(), State: wire.RouteFault, LastError: "bad value quarantined: " + bad.Reason}
		}
		return r, true
	}, func(a, b wire.Route) int { return strings.Compare(a.ID, b.ID) })
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	return out, nil
}
