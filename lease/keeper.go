package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/lifecycle"
	"github.com/gantry-dev/gantry/kv"
)

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// Audit publishes LEASE_EXPIRED and the reclaim moves. Required.
	Audit *audit.Emitter
	// Logger receives the keeper's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Clock paces the periodic scan. Defaults to the real clock.
	Clock clock.Clock
	// Resources are registered at start (idempotently: an existing resource
	// keeps its state). Defaults to none.
	Resources []ResourceSpec
	// ScanInterval is how often every resource is checked for a lease that
	// is gone, besides reacting to each release and expiry as it happens.
	// Defaults to 1 minute.
	ScanInterval time.Duration
}

// Keeper watches gantry_leases: it records every lease expiry as one
// LEASE_EXPIRED event (several keepers on several machines publish the same
// event id, which the audit stream keeps once) and reclaims resources left
// LEASED, RUNNING or COOLDOWN whose lease is gone, at start and whenever a
// lease ends.
//
// It is an actor (lifecycle.Base): Run blocks until Stop or its context
// ends, and runs once; Ready is closed once the config's resources are
// registered and the first reclaim scan is done; Stop ends Run, and is
// idempotent and safe before Run or after it returns.
type Keeper struct {
	lifecycle.Base
	leases *Leases
	res    *Resources
	cfg    KeeperConfig
	log    *slog.Logger
}

// NewKeeper returns a keeper working through js.
func NewKeeper(js jetstream.JetStream, cfg KeeperConfig) (*Keeper, error) {
	if cfg.Audit == nil {
		return nil, errors.New("new keeper: an audit emitter is required")
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	cfg.ScanInterval = cmp.Or(cfg.ScanInterval, time.Minute)
	if cfg.ScanInterval < 0 {
		return nil, fmt.Errorf("new keeper: scan interval %v: want a positive duration", cfg.ScanInterval)
	}
	for _, s := range cfg.Resources {
		if err := checkID(s.ID); err != nil {
			return nil, fmt.Errorf("new keeper: %w", err)
		}
		if _, err := ParseReclaimPolicy(string(s.Reclaim)); err != nil {
			return nil, fmt.Errorf("new keeper: resource %s: %w", s.ID, err)
		}
	}
	res, err := NewResources(js, ResourcesConfig{Audit: cfg.Audit, Logger: cfg.Logger, Clock: cfg.Clock})
	if err != nil {
		return nil, fmt.Errorf("new keeper: %w", err)
	}
	return &Keeper{leases: res.Leases(), res: res, cfg: cfg, log: cfg.Logger}, nil
}

// Run registers the config's resources, reclaims what needs it, then
// follows the lease bucket until Stop or ctx ends. It returns nil on a
// clean stop, and lifecycle.ErrAlreadyRun when called again.
func (k *Keeper) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &k.Base, func(_ context.Context, r *lifecycle.Runner) error {
		ctx := r.StopContext()
		defer func() {
			fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer fcancel()
			if err := k.res.Flush(fctx); err != nil {
				k.log.Warn("audit events not confirmed stored", "err", err)
			}
		}()
		err := k.run(ctx, r.MarkReady)
		if ctx.Err() != nil {
			return nil
		}
		return err
	})
}

// run is Run's body; it calls ready once the first scan is done.
func (k *Keeper) run(ctx context.Context, ready func()) error {
	for _, spec := range k.cfg.Resources {
		res, err := k.res.Add(ctx, spec)
		if err != nil {
			return fmt.Errorf("register resources: %w", err)
		}
		k.log.Info("resource registered", "resource_id", res.ID, "state", res.State)
	}
	w, err := k.leases.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch leases: %w", err)
	}
	defer func() { _ = w.Stop() }()
	owners := map[string]string{}
	// The initial values: current leases, and the markers of recent
	// expiries (a marker lives for the bucket's LimitMarkerTTL).
	for initial := true; initial; {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch leases: watcher closed")
			}
			if e == nil {
				initial = false
				continue
			}
			k.handle(ctx, e, owners, false)
		}
	}
	k.scan(ctx)
	ready()
	t := k.cfg.Clock.NewTimer(k.cfg.ScanInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			k.scan(ctx)
			t.Reset(k.cfg.ScanInterval)
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch leases: watcher closed")
			}
			if e != nil {
				k.handle(ctx, e, owners, true)
			}
		}
	}
}

// handle follows one lease entry. settle says whether to reclaim the
// resource now (the initial values are followed by a full scan instead).
func (k *Keeper) handle(ctx context.Context, e jetstream.KeyValueEntry, owners map[string]string, settle bool) {
	key := e.Key()
	switch e.Operation() {
	case jetstream.KeyValuePut:
		lease, _, err := decodeLease(e)
		if err != nil {
			// Not a lease: deleted (and quarantined) at once.
			if _, _, _, err := k.leases.last(ctx, key); err != nil && ctx.Err() == nil {
				k.log.Warn("check bad lease value", "resource_id", key, "err", err)
			}
			return
		}
		owners[key] = lease.Owner
		return
	case jetstream.KeyValueDelete:
		delete(owners, key)
		if settle {
			k.reclaim(ctx, key, "lease released")
		}
		return
	}
	// A purge marker: the broker expired the key (or someone purged it).
	owner, known := owners[key]
	delete(owners, key)
	reason := "lease expired"
	if strings.HasPrefix(owner, cooldownPrefix) {
		reason = "cooldown over"
	} else {
		msg := fmt.Sprintf("lease on %s expired", key)
		if known {
			msg = fmt.Sprintf("lease of %s on %s expired", owner, key)
		}
		k.leases.ev.emit(wire.Event{
			ID: eventID(e.Created(), "expired", key, fmt.Sprint(e.Revision())), Time: e.Created(),
			Type: wire.EventLeaseExpired, ResourceID: key, Level: wire.LevelWarn, Message: msg,
			Payload: audit.Payload(map[string]any{"owner": owner, "revision": e.Revision()}),
		})
	}
	if settle {
		k.reclaim(ctx, key, reason)
	}
}

// reclaim settles one resource after its lease ended.
func (k *Keeper) reclaim(ctx context.Context, id, reason string) {
	res, moved, err := k.res.Reclaim(ctx, id, reason)
	switch {
	case errors.Is(err, ErrNotFound):
		// A plain lease: no resource to settle.
	case err != nil:
		if ctx.Err() == nil {
			k.log.Warn("reclaim failed", "resource_id", id, "err", err)
		}
	case moved:
		k.log.Info("resource reclaimed", "resource_id", id, "state", res.State, "reason", reason)
	}
}

// scan deletes every lease that is a bad value (one written without the
// broker's TTL would hold its resource forever; see Leases.last), then
// reclaims every resource left in a leased state without its lease.
func (k *Keeper) scan(ctx context.Context) {
	leases, err := kv.Entries(ctx, k.leases.kv, "")
	if err != nil && ctx.Err() == nil {
		k.log.Warn("scan leases failed", "err", err)
	}
	for _, e := range leases {
		if _, _, _, err := k.leases.last(ctx, e.Key()); err != nil && ctx.Err() == nil {
			k.log.Warn("check lease", "resource_id", e.Key(), "err", err)
		}
	}
	entries, err := kv.Entries(ctx, k.res.kv, "")
	if err != nil {
		if ctx.Err() == nil {
			k.log.Warn("scan resources failed", "err", err)
		}
		return
	}
	for _, e := range entries {
		res := k.res.decode(e)
		switch res.State {
		case wire.ResourceLeased, wire.ResourceRunning, wire.ResourceCooldown:
			k.reclaim(ctx, e.Key(), "found without its lease")
		}
	}
}
