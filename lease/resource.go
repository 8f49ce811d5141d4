package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/kv"
)

// ReclaimPolicy says where a resource goes when it is found RUNNING with its
// holder's lease gone (the holder crashed or lost the broker mid-run).
type ReclaimPolicy string

// The reclaim policies. A resource found LEASED (never started) or in
// COOLDOWN with its lease gone always returns to AVAILABLE.
const (
	// ReclaimAvailable returns the resource to AVAILABLE: the default.
	ReclaimAvailable ReclaimPolicy = "available"
	// ReclaimFault moves it to FAULT, for an operator to look at before it
	// is used again (a device left in an unknown state).
	ReclaimFault ReclaimPolicy = "fault"
)

// ParseReclaimPolicy returns the policy named s; empty means
// ReclaimAvailable.
func ParseReclaimPolicy(s string) (ReclaimPolicy, error) {
	switch ReclaimPolicy(strings.ToLower(s)) {
	case "", ReclaimAvailable:
		return ReclaimAvailable, nil
	case ReclaimFault:
		return ReclaimFault, nil
	}
	return "", fmt.Errorf("%w: reclaim policy %q: want available or fault", ErrInvalid, s)
}

// ResourceSpec declares a resource: what Add and the config file register.
type ResourceSpec struct {
	ID string
	// Route is the egress route the resource goes out through, if any.
	Route string
	// Reclaim is the reclaim policy. Defaults to ReclaimAvailable.
	Reclaim ReclaimPolicy
}

// Resource is a resource as stored in gantry_resources: the contract's
// wire.Resource plus its reclaim policy.
type Resource struct {
	wire.Resource
	// Reclaim is where the resource goes when found RUNNING without a lease.
	Reclaim ReclaimPolicy `json:"reclaim,omitempty"`
	// Revision is the KV revision read; moves compare-and-swap on it.
	Revision uint64 `json:"-"`
	// Waiters is the line waiting for the resource, next first, as Get and
	// List read it from gantry_waiters (not stored with the resource).
	Waiters []wire.Waiter `json:"-"`
	// quarantined marks the FAULT stand-in of a value that is not a
	// resource (see decodeResource).
	quarantined bool
}

// moves is the contract's table of allowed state moves, plus the
// operator's disable (from any state) and enable (DISABLED -> AVAILABLE).
var moves = map[wire.ResourceState][]wire.ResourceState{
	wire.ResourceAvailable: {wire.ResourceLeased, wire.ResourceDisabled},
	wire.ResourceLeased:    {wire.ResourceRunning, wire.ResourceAvailable, wire.ResourceDisabled},
	wire.ResourceRunning:   {wire.ResourceCooldown, wire.ResourceFault, wire.ResourceAvailable, wire.ResourceDisabled},
	wire.ResourceCooldown:  {wire.ResourceAvailable, wire.ResourceDisabled},
	wire.ResourceFault:     {wire.ResourceAvailable, wire.ResourceDisabled},
	wire.ResourceDisabled:  {wire.ResourceAvailable},
}

// AllowedMove reports whether a resource may move from one state to
// another.
func AllowedMove(from, to wire.ResourceState) bool { return slices.Contains(moves[from], to) }

// ResourcesConfig configures a resource store.
type ResourcesConfig struct {
	// Audit publishes RESOURCE_STATE_CHANGED (and, through Leases, the lease
	// events). Required.
	Audit *audit.Emitter
	// Logger receives the store's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Clock stamps updated_at. Defaults to the real clock.
	Clock clock.Clock
	// Leases is the lease store resources are leased through. Defaults to
	// NewLeases on the same client with this Audit, Logger and Clock.
	Leases *Leases
	// Bucket is the KV bucket of the resources. Defaults to
	// wire.BucketResources.
	Bucket string
}

// Resources is the resource store on gantry_resources, with the lines of
// those waiting for a resource in gantry_waiters. It is safe for concurrent
// use.
type Resources struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	waiters jetstream.KeyValue
	leases  *Leases
	ev      *events
	clock   clock.Clock
	log     *slog.Logger
	// lines follows the line of each resource this process waits for.
	lines *lines
	// quarantine records the bad resource values met.
	quarantine *kv.Quarantine
}

// NewResources returns the resource store on js's resources bucket.
func NewResources(js jetstream.JetStream, cfg ResourcesConfig) (*Resources, error) {
	if err := deps("new resources", js, cfg.Audit, &cfg.Logger, &cfg.Clock); err != nil {
		return nil, err
	}
	cfg.Bucket = cmp.Or(cfg.Bucket, wire.BucketResources)
	if cfg.Leases == nil {
		l, err := NewLeases(js, LeasesConfig{Audit: cfg.Audit, Logger: cfg.Logger, Clock: cfg.Clock})
		if err != nil {
			return nil, err
		}
		cfg.Leases = l
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	b, err := kv.Open(ctx, js, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("new resources: %w", err)
	}
	waiters, err := kv.Open(ctx, js, wire.BucketWaiters)
	if err != nil {
		return nil, fmt.Errorf("new resources: %w", err)
	}
	ev, err := newEvents(cfg.Audit, js, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("new resources: %w", err)
	}
	r := &Resources{js: js, kv: b, waiters: waiters, leases: cfg.Leases, ev: ev, clock: cfg.Clock, log: cfg.Logger, quarantine: kv.NewQuarantine(ev.emit)}
	r.lines = &lines{r: r, all: map[string]*line{}}
	return r, nil
}

// Leases returns the lease store the resources are leased through.
func (r *Resources) Leases() *Leases { return r.leases }

// Add registers a resource as AVAILABLE. It is idempotent: an existing
// resource keeps its state and takes spec's route and reclaim policy.
func (r *Resources) Add(ctx context.Context, spec ResourceSpec) (Resource, error) {
	if err := checkID(spec.ID); err != nil {
		return Resource{}, err
	}
	policy, err := ParseReclaimPolicy(string(spec.Reclaim))
	if err != nil {
		return Resource{}, err
	}
	res := Resource{
		Resource: wire.Resource{ID: spec.ID, State: wire.ResourceAvailable, RouteID: spec.Route, UpdatedAt: r.clock.Now()},
		Reclaim:  policy,
	}
	data, err := json.Marshal(res)
	if err != nil {
		return Resource{}, fmt.Errorf("add resource %s: %w", spec.ID, err)
	}
	rev, err := r.kv.Create(ctx, spec.ID, data)
	if err == nil {
		res.Revision = rev
		r.emitMove(res, "", "registered")
		return res, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) && !kv.Conflict(err) {
		return Resource{}, fmt.Errorf("add resource %s: %w", spec.ID, err)
	}
	res, _, err = r.change(ctx, spec.ID, "registered over a bad value", func(cur Resource) (Resource, error) {
		if cur.quarantined {
			// Nothing of its state can be read: registered afresh.
			fresh := res
			fresh.Revision = cur.Revision
			return fresh, nil
		}
		if cur.RouteID == spec.Route && cur.Reclaim == policy {
			return cur, errNoChange
		}
		cur.RouteID, cur.Reclaim = spec.Route, policy
		return cur, nil
	})
	if err != nil {
		return Resource{}, fmt.Errorf("add resource %s: %w", spec.ID, err)
	}
	return res, nil
}

// Get returns the resource id, or ErrNotFound.
func (r *Resources) Get(ctx context.Context, id string) (Resource, error) {
	if err := checkID(id); err != nil {
		return Resource{}, err
	}
	res, err := r.get(ctx, id)
	if err != nil {
		return Resource{}, fmt.Errorf("get resource %s: %w", id, err)
	}
	lease, err := r.leases.Get(ctx, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Resource{}, fmt.Errorf("get resource %s: %w", id, err)
	}
	waiting, err := r.waiting(ctx, id+".*")
	if err != nil {
		return Resource{}, fmt.Errorf("get resource %s: %w", id, err)
	}
	withLive(&res, lease, waiting[id])
	return res, nil
}

// withLive gives res the live expiry of its holder's lease and its line.
func withLive(res *Resource, lease wire.Lease, line []wire.Waiter) {
	if res.LeaseOwner != "" && lease.Owner == res.LeaseOwner {
		until := lease.ExpiresAt
		res.LeaseUntil = &until
	}
	res.Waiters = line
}

func (r *Resources) get(ctx context.Context, id string) (Resource, error) {
	e, err := r.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Resource{}, ErrNotFound
	}
	if err != nil {
		return Resource{}, err
	}
	return r.decode(e), nil
}

// decode decodes a resource entry. A value that is not a resource is
// quarantined and stands as a FAULT resource whose last error says so: it
// is listed, never leased, and an operator's enable or disable, or its
// registration from the config, writes a valid value over it.
func (r *Resources) decode(e jetstream.KeyValueEntry) Resource {
	res, err := decodeResource(e)
	if err != nil {
		r.quarantine.Report(err, "treated as FAULT until enabled or registered again")
	}
	return res
}

// decodeResource decodes a resource entry, or returns its FAULT stand-in
// and a *kv.BadValueError.
func decodeResource(e jetstream.KeyValueEntry) (Resource, error) {
	var res Resource
	err := json.Unmarshal(e.Value(), &res)
	if err == nil && !slices.Contains(wire.ResourceStates, res.State) {
		err = fmt.Errorf("state %q is not a resource state", res.State)
	}
	if err != nil {
		bad := kv.BadValue(e.Bucket(), e.Key(), e.Revision(), err)
		return Resource{
			Resource: wire.Resource{ID: e.Key(), State: wire.ResourceFault, LastError: "bad value quarantined: " + bad.Reason, UpdatedAt: e.Created()},
			Reclaim:  ReclaimAvailable, Revision: e.Revision(), quarantined: true,
		}, bad
	}
	res.ID = cmp.Or(res.ID, e.Key())
	res.Reclaim = cmp.Or(res.Reclaim, ReclaimAvailable)
	res.Revision = e.Revision()
	return res, nil
}

// List returns every resource, sorted by id, with its line. A LEASED or
// RUNNING resource's lease_until is its holder's live lease expiry.
func (r *Resources) List(ctx context.Context) ([]Resource, error) {
	entries, err := kv.Entries(ctx, r.kv, "")
	if err != nil {
		return nil, fmt.Errorf("list resources: %w", err)
	}
	leases, err := r.leases.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list resources: %w", err)
	}
	waiting, err := r.waiting(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list resources: %w", err)
	}
	byID := make(map[string]wire.Lease, len(leases))
	for _, l := range leases {
		byID[l.Resource] = l
	}
	out := make([]Resource, 0, len(entries))
	for _, e := range entries {
		res := r.decode(e)
		withLive(&res, byID[res.ID], waiting[res.ID])
		out = append(out, res)
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// SetState is an operator's move of resource id to state to, with a reason
// for the audit trail. A move outside the allowed table, or to LEASED,
// RUNNING or COOLDOWN (which only a lease holder makes), is refused with an
// *IllegalMoveError. Moving to the current state changes nothing. The live
// lease, if any, is left alone.
func (r *Resources) SetState(ctx context.Context, id string, to wire.ResourceState, reason string) (Resource, error) {
	if err := checkID(id); err != nil {
		return Resource{}, err
	}
	if reason == "" {
		return Resource{}, fmt.Errorf("%w: set resource state: a reason is required", ErrInvalid)
	}
	res, _, err := r.change(ctx, id, reason, func(cur Resource) (Resource, error) {
		if cur.State == to {
			return cur, errNoChange
		}
		switch to {
		case wire.ResourceLeased, wire.ResourceRunning:
			return cur, &IllegalMoveError{Resource: id, From: cur.State, To: to, Why: "only a lease holder moves a resource there (gantry lease run, or a task)"}
		case wire.ResourceCooldown:
			return cur, &IllegalMoveError{Resource: id, From: cur.State, To: to, Why: "a cooldown is set by its holder when it finishes"}
		}
		next := cur
		next.State = to
		next.LeaseOwner, next.LeaseUntil = "", nil
		if to == wire.ResourceFault {
			next.LastError = reason
		}
		return next, nil
	})
	if err != nil {
		r.refused(err, reason)
		return Resource{}, fmt.Errorf("set resource state: %w", err)
	}
	return res, nil
}

// refused records an illegal move as a RESOURCE_MOVE_REFUSED event.
func (r *Resources) refused(err error, reason string) {
	var ime *IllegalMoveError
	if !errors.As(err, &ime) {
		return
	}
	r.ev.emit(wire.Event{
		Type: wire.EventResourceMoveRefused, ResourceID: ime.Resource, Level: wire.LevelWarn,
		Message: ime.Error(),
		Payload: audit.Payload(map[string]any{"from": ime.From, "to": ime.To, "reason": reason, "why": ime.Why}),
	})
}

// Disable takes resource id out of service (from any state): it cannot be
// leased until Enable. A holder already running on it keeps its lease until
// it finishes; its Finish then leaves the resource DISABLED.
func (r *Resources) Disable(ctx context.Context, id, reason string) (Resource, error) {
	return r.SetState(ctx, id, wire.ResourceDisabled, cmp.Or(reason, "disabled by operator"))
}

// Enable returns a DISABLED (or FAULT) resource to AVAILABLE. An AVAILABLE
// resource is left as is; any other state is an *IllegalMoveError.
func (r *Resources) Enable(ctx context.Context, id, reason string) (Resource, error) {
	if err := checkID(id); err != nil {
		return Resource{}, err
	}
	reason = cmp.Or(reason, "enabled by operator")
	res, _, err := r.change(ctx, id, reason, func(cur Resource) (Resource, error) {
		switch cur.State {
		case wire.ResourceAvailable:
			return cur, errNoChange
		case wire.ResourceDisabled, wire.ResourceFault:
			next := cur
			next.State = wire.ResourceAvailable
			return next, nil
		}
		return cur, &IllegalMoveError{Resource: id, From: cur.State, To: wire.ResourceAvailable, Why: "enable applies to a DISABLED or FAULT resource"}
	})
	if err != nil {
		r.refused(err, reason)
		return Resource{}, fmt.Errorf("enable resource: %w", err)
	}
	return res, nil
}

// Reclaim returns resource id to service if it is LEASED, RUNNING or
// COOLDOWN while its lease is gone (or held by someone other than its
// recorded holder): COOLDOWN and LEASED go to AVAILABLE, RUNNING follows the
// resource's reclaim policy. It reports whether it moved the resource.
func (r *Resources) Reclaim(ctx context.Context, id, reason string) (Resource, bool, error) {
	if err := checkID(id); err != nil {
		return Resource{}, false, err
	}
	res, moved, err := r.change(ctx, id, reason, func(cur Resource) (Resource, error) {
		switch cur.State {
		case wire.ResourceLeased, wire.ResourceRunning, wire.ResourceCooldown:
		default:
			return cur, errNoChange
		}
		lease, err := r.leases.Get(ctx, id)
		held := err == nil
		// A bad lease value backs nobody (an acquire deletes it).
		if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, kv.ErrBadValue) {
			return cur, err
		}
		if !stale(cur, lease, held) {
			return cur, errNoChange
		}
		next := cur
		next.LeaseOwner, next.LeaseUntil = "", nil
		next.State = wire.ResourceAvailable
		if cur.State == wire.ResourceRunning && cur.Reclaim == ReclaimFault {
			next.State = wire.ResourceFault
			next.LastError = fmt.Sprintf("lease of %s lost while RUNNING", cur.LeaseOwner)
		}
		return next, nil
	})
	if err != nil {
		return Resource{}, false, fmt.Errorf("reclaim resource %s: %w", id, err)
	}
	return res, moved, nil
}

// stale reports whether res is in a leased state that its lease no longer
// backs.
func stale(res Resource, lease wire.Lease, held bool) bool {
	switch res.State {
	case wire.ResourceLeased, wire.ResourceRunning:
		return !held || (lease.Owner != res.LeaseOwner && lease.Owner != CooldownOwner(res.LeaseOwner))
	case wire.ResourceCooldown:
		return !held || !strings.HasPrefix(lease.Owner, cooldownPrefix)
	}
	return false
}

// errNoChange tells change that the resource is already as wanted.
var errNoChange = errors.New("no change")

// maxCASAttempts bounds change's retries under concurrent writes.
const maxCASAttempts = 20

// change reads resource id, lets fn compute the next value and writes it at
// the read revision, retrying from a fresh read when someone else wrote in
// between. A state change is checked against the move table and recorded as
// a RESOURCE_STATE_CHANGED event with reason. It reports whether it wrote.
func (r *Resources) change(ctx context.Context, id, reason string, fn func(Resource) (Resource, error)) (Resource, bool, error) {
	return r.changeFrom(ctx, id, reason, nil, fn)
}

// changeFrom is change starting from known, the value the caller last wrote
// or read, which saves a read when it is still current. fn's verdict on
// known is trusted only through the compare-and-swap: if fn declines to
// write, the resource is read again and fn asked again.
func (r *Resources) changeFrom(ctx context.Context, id, reason string, known *Resource, fn func(Resource) (Resource, error)) (Resource, bool, error) {
	for range maxCASAttempts {
		if known != nil {
			k := *known
			known = nil
			if next, err := fn(k); err == nil {
				written, ok, err := r.write(ctx, id, reason, k, next)
				if ok || (err != nil && !errors.Is(err, ErrIllegalMove)) {
					return written, ok, err
				}
			}
		}
		cur, err := r.get(ctx, id)
		if err != nil {
			return Resource{}, false, fmt.Errorf("resource %s: %w", id, err)
		}
		next, err := fn(cur)
		if errors.Is(err, errNoChange) {
			return cur, false, nil
		}
		if err != nil {
			return cur, false, err
		}
		written, ok, err := r.write(ctx, id, reason, cur, next)
		if ok || err != nil {
			return written, ok, err
		}
	}
	return Resource{}, false, fmt.Errorf("resource %s: still contended after %d attempts", id, maxCASAttempts)
}

// write stores next at cur's revision. ok is false, with a nil error, when
// someone else wrote in between.
func (r *Resources) write(ctx context.Context, id, reason string, cur, next Resource) (Resource, bool, error) {
	if next.State != cur.State && !AllowedMove(cur.State, next.State) {
		return cur, false, &IllegalMoveError{Resource: id, From: cur.State, To: next.State}
	}
	next.UpdatedAt = r.clock.Now()
	data, err := json.Marshal(next)
	if err != nil {
		return cur, false, fmt.Errorf("resource %s: %w", id, err)
	}
	rev, err := r.kv.Update(ctx, id, data, cur.Revision)
	if kv.Conflict(err) {
		return cur, false, nil
	}
	if err != nil {
		return cur, false, fmt.Errorf("resource %s: %w", id, err)
	}
	next.Revision = rev
	if next.State != cur.State {
		r.emitMove(next, cur.State, reason)
	}
	return next, true, nil
}

// emitMove records res's move from from to its state. The event id derives
// from the resource and revision, so a retried publish is stored once.
func (r *Resources) emitMove(res Resource, from wire.ResourceState, reason string) {
	level := wire.LevelInfo
	if res.State == wire.ResourceFault {
		level = wire.LevelWarn
	}
	msg := fmt.Sprintf("%s %s -> %s", res.ID, cmp.Or(string(from), "(new)"), res.State)
	if reason != "" {
		msg += ": " + reason
	}
	r.ev.emit(wire.Event{
		ID: eventID(res.UpdatedAt, "state", res.ID, fmt.Sprint(res.Revision)), Time: res.UpdatedAt,
		Type: wire.EventResourceStateChanged, ResourceID: res.ID, RouteID: res.RouteID, Level: level,
		Message: msg,
		Payload: audit.Payload(map[string]any{
			"from": from, "to": res.State, "reason": reason, "lease_owner": res.LeaseOwner,
			"last_error": res.LastError, "revision": res.Revision,
		}),
	})
}

// Flush waits until the audit events of every operation so far (of this
// store and its lease store) are stored, or ctx ends.
func (r *Resources) Flush(ctx context.Context) error {
	return errors.Join(r.ev.flush(ctx), r.leases.Flush(ctx))
}

// cooldownPrefix marks the owner of a lease that holds a resource through
// its cooldown.
const cooldownPrefix = "cooldown:"

// CooldownOwner is the owner of the lease that holds a resource through the
// cooldown its holder owner asked for when it finished.
func CooldownOwner(owner string) string { return cooldownPrefix + owner }

// resourceTimeout bounds the cleanup writes made after a failure, when the
// caller's context may be done.
const resourceTimeout = 10 * time.Second
