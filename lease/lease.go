package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/kv"
)

// LeasesConfig configures a lease store.
type LeasesConfig struct {
	// Audit publishes RESOURCE_LEASED, RESOURCE_RELEASED and LEASE_CONFLICT.
	// Required.
	Audit *audit.Emitter
	// Logger receives the store's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Clock stamps expires_at and paces Holder renewals. Defaults to the
	// real clock.
	Clock clock.Clock
	// Bucket is the KV bucket of the leases. Defaults to wire.BucketLeases.
	Bucket string
	// ConflictWindow coalesces LEASE_CONFLICT events: one owner's
	// conflicts on one resource make at most one event a window, which
	// counts them (see docs/leases.md). Defaults to DefaultConflictWindow.
	ConflictWindow time.Duration
}

// Leases is the lease store on the gantry_leases bucket. It is safe for
// concurrent use.
type Leases struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream jetstream.Stream // KV_<bucket>
	prefix string           // $KV.<bucket>.
	ev     *events
	clock  clock.Clock
	log    *slog.Logger
	// conflicts coalesces the LEASE_CONFLICT events.
	conflicts *conflicts
	// quarantine records the bad lease values met.
	quarantine *kv.Quarantine
	bucket     string

	// hints remembers, per resource, the revision of the last delete or
	// expiry marker this store wrote or read, so that the next Acquire can
	// compare-and-swap on it in one round trip. It never holds the revision
	// of a live lease (that would let Acquire overwrite it): a marker's
	// revision can only match while the key is free. A stale hint costs one
	// extra read, nothing else.
	hintsMu sync.Mutex
	hints   map[string]uint64
}

// lookupTimeout bounds the bucket lookup of the constructors.
const lookupTimeout = 10 * time.Second

// deps checks the dependencies both stores require and fills the defaults
// of their logger and clock; op names the constructor in errors.
func deps(op string, js jetstream.JetStream, emitter *audit.Emitter, log **slog.Logger, clk *clock.Clock) error {
	if js == nil {
		return fmt.Errorf("%s: a JetStream client is required", op)
	}
	if emitter == nil {
		return fmt.Errorf("%s: an audit emitter is required", op)
	}
	*log = cmp.Or(*log, slog.New(slog.DiscardHandler))
	*clk = cmp.Or[clock.Clock](*clk, clock.Real{})
	return nil
}

// NewLeases returns the lease store on js's leases bucket.
func NewLeases(js jetstream.JetStream, cfg LeasesConfig) (*Leases, error) {
	if err := deps("new leases", js, cfg.Audit, &cfg.Logger, &cfg.Clock); err != nil {
		return nil, err
	}
	cfg.Bucket = cmp.Or(cfg.Bucket, wire.BucketLeases)
	cfg.ConflictWindow = cmp.Or(cfg.ConflictWindow, DefaultConflictWindow)
	if cfg.ConflictWindow < 0 {
		return nil, fmt.Errorf("new leases: conflict window %v: want a positive duration", cfg.ConflictWindow)
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	b, err := kv.Open(ctx, js, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("new leases: %w", err)
	}
	stream, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("new leases: bucket %s: %w", cfg.Bucket, err)
	}
	ev, err := newEvents(cfg.Audit, js, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("new leases: %w", err)
	}
	return &Leases{
		js:     js,
		kv:     b,
		stream: stream,
		hints:  map[string]uint64{},
		prefix: "$KV." + cfg.Bucket + ".",
		ev:     ev,
		clock:  cfg.Clock,
		log:    cfg.Logger,

		conflicts:  newConflicts(cfg.Clock, cfg.ConflictWindow),
		quarantine: kv.NewQuarantine(ev.emit),
		bucket:     cfg.Bucket,
	}, nil
}

// leaseValue is what a lease key holds: wire.Lease without the revision
// (which is the key's), plus the TTL it was written with.
type leaseValue struct {
	Resource   string    `json:"resource"`
	Owner      string    `json:"owner"`
	ExpiresAt  time.Time `json:"expires_at"`
	TTL        string    `json:"ttl"`
	AcquiredAt time.Time `json:"acquired_at"`
}

func (v leaseValue) lease(rev uint64) wire.Lease {
	return wire.Lease{Resource: v.Resource, Owner: v.Owner, ExpiresAt: v.ExpiresAt, Revision: rev}
}

func (v leaseValue) ttl() time.Duration {
	d, err := time.ParseDuration(v.TTL)
	if err != nil {
		return 0
	}
	return d
}

var idPattern = regexp.MustCompile(`^[-/_=A-Za-z0-9]+$`)

// ValidID reports whether id can name a resource (and its lease): letters,
// digits, '-', '_', '/' and '='.
func ValidID(id string) bool { return idPattern.MatchString(id) }

func checkID(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: resource id %q: want letters, digits, '-', '_', '/' or '='", ErrInvalid, id)
	}
	return nil
}

// MaxTTL is the longest TTL of a lease (a cooldown's included): a lease
// that outlives its holder by more is no better than one that never
// expires. A lease value that claims a longer TTL is forged.
const MaxTTL = 24 * time.Hour

// TTL returns the TTL the broker will apply for ttl: whole seconds,
// rounded up, at least 1 s. A ttl over MaxTTL is ErrInvalid.
func TTL(ttl time.Duration) (time.Duration, error) {
	if ttl <= 0 || ttl > MaxTTL {
		return 0, fmt.Errorf("%w: lease ttl %v: want a positive duration, at most %v", ErrInvalid, ttl, MaxTTL)
	}
	return kv.TTLSeconds(ttl), nil
}

// Acquire takes the lease on resource for owner, for ttl (rounded up to
// whole seconds). If another owner holds it, Acquire returns a
// *ConflictError (errors.Is(err, ErrConflict)) and changes nothing. If owner
// already holds it, Acquire renews it: an owner must name exactly one holder.
func (l *Leases) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (wire.Lease, error) {
	if err := checkID(resource); err != nil {
		return wire.Lease{}, err
	}
	if owner == "" {
		return wire.Lease{}, fmt.Errorf("%w: acquire lease: owner is required", ErrInvalid)
	}
	ttl, err := TTL(ttl)
	if err != nil {
		return wire.Lease{}, err
	}
	expect := l.hint(resource)
	for range maxCASAttempts {
		now := l.clock.Now()
		v := leaseValue{Resource: resource, Owner: owner, ExpiresAt: now.Add(ttl), TTL: ttl.String(), AcquiredAt: now}
		rev, err := l.publish(ctx, resource, v, expect, ttl)
		if err == nil {
			if ev, ok := l.conflicts.take(resource, owner); ok {
				l.ev.emit(ev)
			}
			l.ev.emit(wire.Event{
				Type: wire.EventResourceLeased, ResourceID: resource,
				Message: fmt.Sprintf("%s leased %s for %v", owner, resource, ttl),
				Payload: audit.Payload(map[string]any{"owner": owner, "ttl": ttl.String(), "expires_at": v.ExpiresAt, "revision": rev}),
			})
			return v.lease(rev), nil
		}
		if !kv.Conflict(err) {
			return wire.Lease{}, fmt.Errorf("acquire lease %s: %w", resource, err)
		}
		last, cur, live, err := l.last(ctx, resource)
		if err != nil {
			return wire.Lease{}, fmt.Errorf("acquire lease %s: %w", resource, err)
		}
		if !live {
			expect = last // free: lapsed, released or never taken
			continue
		}
		if cur.Owner == owner {
			return l.Renew(ctx, cur, ttl)
		}
		conflict := &ConflictError{Resource: resource, Holder: cur.Owner, ExpiresAt: cur.ExpiresAt, Revision: cur.Revision}
		if ev, ok := l.conflicts.note(resource, owner, cur); ok {
			l.ev.emit(ev)
		}
		return wire.Lease{}, conflict
	}
	return wire.Lease{}, fmt.Errorf("acquire lease %s: still contended after %d attempts", resource, maxCASAttempts)
}

// publish writes v as resource's lease if the key's last revision is
// expect (0: the key has no message at all), with a per-message TTL. KV's
// Update and Put would drop the TTL, and Create needs extra round trips
// over a delete marker, so it publishes to the key's subject itself.
func (l *Leases) publish(ctx context.Context, resource string, v leaseValue, expect uint64, ttl time.Duration) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	msg := nats.NewMsg(l.prefix + resource)
	msg.Data = data
	ack, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(ttl))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// last reads the last message of resource's key: its revision (0 if none),
// and the lease if it is a live one rather than a delete or expiry marker.
// A bad value — not a lease, or written without a TTL from 1 s to MaxTTL,
// which no lease gantry writes lacks — is deleted and quarantined: no value
// holds a resource forever. The key is then free at the delete's revision.
func (l *Leases) last(ctx context.Context, resource string) (uint64, wire.Lease, bool, error) {
	m, err := l.stream.GetLastMsgForSubject(ctx, l.prefix+resource)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, wire.Lease{}, false, nil
	}
	if err != nil {
		return 0, wire.Lease{}, false, err
	}
	if kv.Marker(m.Header) {
		l.setHint(resource, m.Sequence)
		return m.Sequence, wire.Lease{}, false, nil
	}
	var v leaseValue
	bad := json.Unmarshal(m.Data, &v)
	if bad == nil && v.Owner == "" {
		bad = errors.New("no owner")
	}
	if bad == nil {
		bad = kv.CheckTTL(m.Header, MaxTTL)
	}
	if bad != nil {
		rev, err := l.deleteBad(ctx, resource, m.Sequence, bad)
		return rev, wire.Lease{}, false, err
	}
	v.Resource = cmp.Or(v.Resource, resource)
	return m.Sequence, v.lease(m.Sequence), true, nil
}

// deleteBad deletes the bad value of resource's key at rev, if it is still
// the last, and quarantines it. It returns the key's last revision: the
// delete's, or rev if someone wrote in between (a compare-and-swap on it
// then fails, and the caller reads again).
func (l *Leases) deleteBad(ctx context.Context, resource string, rev uint64, why error) (uint64, error) {
	msg := nats.NewMsg(l.prefix + resource)
	msg.Header.Set(kvOperationHeader, "DEL")
	ack, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev))
	if kv.Conflict(err) {
		return rev, nil
	}
	if err != nil {
		return 0, fmt.Errorf("delete bad lease value %s: %w", resource, err)
	}
	l.setHint(resource, ack.Sequence)
	l.quarantine.Report(kv.BadValue(l.bucket, resource, rev, why), "deleted")
	return ack.Sequence, nil
}

// kvOperationHeader marks KV delete and purge markers (KV-Operation: DEL or
// PURGE), as the KV protocol defines.
const kvOperationHeader = "KV-Operation"

func (l *Leases) hint(resource string) uint64 {
	l.hintsMu.Lock()
	defer l.hintsMu.Unlock()
	return l.hints[resource]
}

func (l *Leases) setHint(resource string, rev uint64) {
	l.hintsMu.Lock()
	defer l.hintsMu.Unlock()
	l.hints[resource] = rev
}

// Renew restarts the TTL of lease, for ttl, if lease is still the current
// one (compare-and-swap on its revision). A ttl of 0 keeps the TTL the lease
// was written with. If the lease lapsed, was released or is held by someone
// else, Renew returns ErrLost (with a *ConflictError when another owner
// holds it) and changes nothing.
func (l *Leases) Renew(ctx context.Context, lease wire.Lease, ttl time.Duration) (wire.Lease, error) {
	if err := checkID(lease.Resource); err != nil {
		return wire.Lease{}, err
	}
	if lease.Revision == 0 || lease.Owner == "" {
		return wire.Lease{}, fmt.Errorf("renew lease %s: %w (no owner or revision)", lease.Resource, ErrLost)
	}
	if ttl == 0 {
		cur, curTTL, err := l.get(ctx, lease.Resource)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return wire.Lease{}, fmt.Errorf("renew lease %s: %w", lease.Resource, err)
		}
		if err != nil || cur.Revision != lease.Revision {
			return wire.Lease{}, l.lost(ctx, "renew", lease)
		}
		ttl = curTTL
	}
	ttl, err := TTL(ttl)
	if err != nil {
		return wire.Lease{}, err
	}
	renewed, err := l.write(ctx, lease, lease.Owner, ttl)
	if err != nil {
		return wire.Lease{}, fmt.Errorf("renew lease %s: %w", lease.Resource, err)
	}
	return renewed, nil
}

// write replaces lease (compare-and-swap on its revision) with one held by
// owner for ttl. Update and Put would drop the key's TTL, so it publishes
// to the key's subject with the expected last subject sequence and a
// message TTL.
func (l *Leases) write(ctx context.Context, lease wire.Lease, owner string, ttl time.Duration) (wire.Lease, error) {
	now := l.clock.Now()
	v := leaseValue{Resource: lease.Resource, Owner: owner, ExpiresAt: now.Add(ttl), TTL: ttl.String(), AcquiredAt: now}
	rev, err := l.publish(ctx, lease.Resource, v, lease.Revision, ttl)
	if kv.Conflict(err) {
		return wire.Lease{}, l.lost(ctx, "write", lease)
	}
	if err != nil {
		return wire.Lease{}, err
	}
	return v.lease(rev), nil
}

// Release gives lease up (a delete at its revision). If it is no longer the
// current lease, Release returns ErrLost (with a *ConflictError when
// another owner holds it) and changes nothing.
func (l *Leases) Release(ctx context.Context, lease wire.Lease) error {
	if err := checkID(lease.Resource); err != nil {
		return err
	}
	if lease.Revision == 0 {
		return fmt.Errorf("release lease %s: %w (no revision)", lease.Resource, ErrLost)
	}
	msg := nats.NewMsg(l.prefix + lease.Resource)
	msg.Header.Set(kvOperationHeader, "DEL")
	ack, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(lease.Revision))
	if err == nil {
		l.setHint(lease.Resource, ack.Sequence)
	}
	if kv.Conflict(err) {
		return fmt.Errorf("release lease %s: %w", lease.Resource, l.lost(ctx, "release", lease))
	}
	if err != nil {
		return fmt.Errorf("release lease %s: %w", lease.Resource, err)
	}
	l.ev.emit(wire.Event{
		Type: wire.EventResourceReleased, ResourceID: lease.Resource,
		Message: fmt.Sprintf("%s released %s", lease.Owner, lease.Resource),
		Payload: audit.Payload(map[string]any{"owner": lease.Owner, "revision": lease.Revision}),
	})
	return nil
}

// lost explains why lease is not current: ErrLost, joined with a
// *ConflictError if another owner holds the resource now.
func (l *Leases) lost(ctx context.Context, op string, lease wire.Lease) error {
	cur, _, err := l.get(ctx, lease.Resource)
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%s %s: %w (it lapsed or was released)", op, lease.Resource, ErrLost)
	case err != nil:
		return fmt.Errorf("%s %s: %w (and reading it: %v)", op, lease.Resource, ErrLost, err)
	case cur.Owner != lease.Owner:
		return fmt.Errorf("%w: %w", ErrLost, &ConflictError{Resource: lease.Resource, Holder: cur.Owner, ExpiresAt: cur.ExpiresAt, Revision: cur.Revision})
	default:
		return fmt.Errorf("%s %s: %w (renewed elsewhere at revision %d)", op, lease.Resource, ErrLost, cur.Revision)
	}
}

// Get returns the current lease on resource, or ErrNotFound.
func (l *Leases) Get(ctx context.Context, resource string) (wire.Lease, error) {
	if err := checkID(resource); err != nil {
		return wire.Lease{}, err
	}
	lease, _, err := l.get(ctx, resource)
	if err != nil {
		return wire.Lease{}, fmt.Errorf("get lease %s: %w", resource, err)
	}
	return lease, nil
}

func (l *Leases) get(ctx context.Context, resource string) (wire.Lease, time.Duration, error) {
	e, err := l.kv.Get(ctx, resource)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.Lease{}, 0, ErrNotFound
	}
	if err != nil {
		return wire.Lease{}, 0, err
	}
	return decodeLease(e)
}

func decodeLease(e jetstream.KeyValueEntry) (wire.Lease, time.Duration, error) {
	var v leaseValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return wire.Lease{}, 0, kv.BadValue(e.Bucket(), e.Key(), e.Revision(), err)
	}
	v.Resource = cmp.Or(v.Resource, e.Key())
	return v.lease(e.Revision()), v.ttl(), nil
}

// List returns every current lease, sorted by resource.
func (l *Leases) List(ctx context.Context) ([]wire.Lease, error) {
	entries, err := kv.Entries(ctx, l.kv, "")
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	out := make([]wire.Lease, 0, len(entries))
	for _, e := range entries {
		lease, _, err := decodeLease(e)
		if err != nil {
			l.log.Warn("skipping undecodable lease", "resource_id", e.Key(), "err", err)
			continue
		}
		out = append(out, lease)
	}
	slices.SortFunc(out, func(a, b wire.Lease) int { return strings.Compare(a.Resource, b.Resource) })
	return out, nil
}

// Flush records the lease conflicts not yet reported, then waits until
// the audit events of every operation so far are stored, or ctx ends.
// Events are published without waiting on the hot path; call Flush before a
// short-lived process exits.
func (l *Leases) Flush(ctx context.Context) error {
	for _, ev := range l.conflicts.takeAll() {
		l.ev.emit(ev)
	}
	return l.ev.flush(ctx)
}
