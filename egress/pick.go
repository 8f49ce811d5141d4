package egress

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/clock"
)

// ErrNoRoutes is returned for route "auto" when gantry_routes holds no route
// at all: no config names one, so waiting would not help.
var ErrNoRoutes = errors.New("no egress routes configured")

// permanentRouteError marks an error that waiting does not cure (an unknown
// route, no routes at all): workers send the task to NEEDS_REVIEW.
type permanentRouteError struct{ err error }

func (e *permanentRouteError) Error() string { return e.err.Error() }
func (e *permanentRouteError) Unwrap() error { return e.err }

// Permanent reports true: retrying does not help.
func (e *permanentRouteError) Permanent() bool { return true }

// UnavailableError says that the route asked for (or, for "auto",
// every route) cannot take traffic now. It is a delayed retry: RetryAfter
// tells when to try again, the end of the route's cooldown when known.
type UnavailableError struct {
	// Route is the route asked for: an id or "auto".
	Route string
	// State is the route's state; empty for "auto".
	State wire.RouteState
	// Wait is how long to wait before trying again.
	Wait time.Duration
}

// Error names the route, its state and the wait.
func (e *UnavailableError) Error() string {
	if e.Route == wire.RouteAuto {
		return fmt.Sprintf("no egress route is AVAILABLE; retry in %v", clock.Round(e.Wait))
	}
	return fmt.Sprintf("route %q is %s; retry in %v", e.Route, e.State, clock.Round(e.Wait))
}

// RetryAfter returns how long to wait before trying again.
func (e *UnavailableError) RetryAfter() time.Duration { return e.Wait }

// PickerConfig tunes a Picker.
type PickerConfig struct {
	// Clock tells the time for cooldown waits. Defaults to the real clock.
	Clock clock.Clock
	// Wait is the retry hint when a route is unavailable with no known end
	// (FAULT, DISABLED, or every route in such a state). Defaults to 30s.
	Wait time.Duration
	// MinWait is the shortest retry hint, for a cooldown about to end.
	// Defaults to 1s.
	MinWait time.Duration
	// Dialer makes the first hop of every connection. Defaults to a
	// net.Dialer with a 30s connect timeout.
	Dialer *net.Dialer
	// Logger receives the picker's warnings. Defaults to discarding them.
	Logger *slog.Logger
}

// Picker gives http tasks a transport through an egress route, picked
// from gantry_routes by state and score, and reports failed real traffic
// back to healthd. It picks from a live view of the bucket kept by a watch
// (no round trip per task; a change shows within milliseconds), reading
// the bucket only for a route the view does not hold. It is safe for concurrent use; Close it when
// done.
type Picker struct {
	cfg   PickerConfig
	store *Store
	nc    *nats.Conn

	mu         sync.Mutex
	transports map[string]*Transport

	// watch keeps cache, the live view of gantry_routes "auto" picks from.
	watch     jetstream.KeyWatcher
	stopWatch context.CancelFunc
	followed  chan struct{}
	cacheMu   sync.RWMutex
	cache     map[string]wire.Route
	cacheLive bool
	closeOnce sync.Once
}

// NewPicker returns a picker reading gantry_routes through js and
// publishing reports on nc.
func NewPicker(ctx context.Context, cfg PickerConfig, nc *nats.Conn, js jetstream.JetStream) (*Picker, error) {
	if nc == nil || js == nil {
		return nil, errors.New("route picker: needs a NATS connection and JetStream")
	}
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	cfg.Wait = cmp.Or(cfg.Wait, 30*time.Second)
	cfg.MinWait = cmp.Or(cfg.MinWait, time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	store, err := NewStore(ctx, js)
	if err != nil {
		return nil, err
	}
	p := &Picker{
		cfg: cfg, store: store, nc: nc, transports: map[string]*Transport{},
		cache: map[string]wire.Route{}, followed: make(chan struct{}),
	}
	wctx, cancel := context.WithCancel(context.Background())
	w, err := store.kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch bucket %s: %w", wire.BucketRoutes, err)
	}
	p.watch, p.stopWatch = w, cancel
	for initial := true; initial; {
		select {
		case <-ctx.Done():
			_ = w.Stop()
			cancel()
			return nil, fmt.Errorf("watch bucket %s: %w", wire.BucketRoutes, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				cancel()
				return nil, fmt.Errorf("watch bucket %s: closed", wire.BucketRoutes)
			}
			if e == nil {
				initial = false
				break
			}
			p.apply(e)
		}
	}
	p.cacheLive = true
	go p.follow()
	return p, nil
}

// follow keeps the cache current until the watch ends.
func (p *Picker) follow() {
	defer close(p.followed)
	for e := range p.watch.Updates() {
		if e != nil {
			p.apply(e)
		}
	}
	p.cacheMu.Lock()
	p.cacheLive = false
	p.cacheMu.Unlock()
}

// apply records one watched change of gantry_routes.
func (p *Picker) apply(e jetstream.KeyValueEntry) {
	p.cacheMu.Lock()
	defer p.cacheMu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(p.cache, e.Key())
		return
	}
	var r wire.Route
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		p.cfg.Logger.Warn("route not decoded", "route_id", e.Key(), "err", err)
		delete(p.cache, e.Key())
		return
	}
	p.cache[e.Key()] = r
}

// route returns route id from the live cache, or read from the bucket
// when the cache does not have it.
func (p *Picker) route(ctx context.Context, id string) (wire.Route, error) {
	p.cacheMu.RLock()
	r, ok := p.cache[id]
	live := p.cacheLive
	p.cacheMu.RUnlock()
	if ok && live {
		return r, nil
	}
	r, _, err := p.store.Get(ctx, id)
	return r, err
}

// routes returns every route: from the live cache, or read from the bucket
// when the watch has ended.
func (p *Picker) routes(ctx context.Context) ([]wire.Route, error) {
	p.cacheMu.RLock()
	if p.cacheLive {
		out := make([]wire.Route, 0, len(p.cache))
		for _, r := range p.cache {
			out = append(out, r)
		}
		p.cacheMu.RUnlock()
		return out, nil
	}
	p.cacheMu.RUnlock()
	return p.store.List(ctx)
}

// Pick returns the route to send traffic through: for "auto" the
// AVAILABLE route with the best score (ties: lower latency, then id), for
// an id that route if it is AVAILABLE. An unavailable route is a
// *UnavailableError; an unknown id wraps ErrNotFound and "auto"
// with no route at all wraps ErrNoRoutes, both with a Permanent() method
// that reports true.
func (p *Picker) Pick(ctx context.Context, route string) (wire.Route, error) {
	if route != wire.RouteAuto {
		r, err := p.route(ctx, route)
		if errors.Is(err, ErrNotFound) {
			return wire.Route{}, &permanentRouteError{err}
		}
		if err != nil {
			return wire.Route{}, err
		}
		if r.State != wire.RouteAvailable {
			return wire.Route{}, &UnavailableError{Route: route, State: r.State, Wait: p.wait(r)}
		}
		return r, nil
	}
	all, err := p.routes(ctx)
	if err != nil {
		return wire.Route{}, err
	}
	if len(all) == 0 {
		return wire.Route{}, &permanentRouteError{ErrNoRoutes}
	}
	var best *wire.Route
	wait := time.Duration(0)
	for i := range all {
		r := &all[i]
		if r.State != wire.RouteAvailable {
			if w := p.wait(*r); wait == 0 || w < wait {
				wait = w
			}
			continue
		}
		if best == nil || better(r, best) {
			best = r
		}
	}
	if best == nil {
		return wire.Route{}, &UnavailableError{Route: wire.RouteAuto, Wait: wait}
	}
	return *best, nil
}

func better(a, b *wire.Route) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	if a.LatencyMS != b.LatencyMS {
		return a.LatencyMS < b.LatencyMS
	}
	return a.ID < b.ID
}

// wait is the retry hint for unavailable route r.
func (p *Picker) wait(r wire.Route) time.Duration {
	if r.State == wire.RouteCooldown && r.CooldownUntil != nil {
		return max(r.CooldownUntil.Sub(p.cfg.Clock.Now()), p.cfg.MinWait)
	}
	return p.cfg.Wait
}

// Transport picks a route as Pick does and returns a transport that goes
// out through it, with the id of the route picked. Transports are cached
// per proxy, so connections are reused across tasks.
func (p *Picker) Transport(ctx context.Context, route string) (http.RoundTripper, string, error) {
	r, err := p.Pick(ctx, route)
	if err != nil {
		return nil, "", err
	}
	proxy := cmp.Or(r.Proxy, wire.RouteDirect)
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.transports[proxy]; ok {
		return t, r.ID, nil
	}
	t, err := NewTransport(proxy, p.cfg.Dialer)
	if err != nil {
		return nil, "", fmt.Errorf("route %q: %w", r.ID, err)
	}
	p.transports[proxy] = t
	return t, r.ID, nil
}

// Report tells healthd that real traffic through routeID failed with err,
// so the route's health reflects it. A nil err and a cancelled request
// (not the route's fault) are not reported. Publishing is best effort: a
// failure is logged.
func (p *Picker) Report(ctx context.Context, routeID string, err error) {
	if err == nil || routeID == "" || errors.Is(err, context.Canceled) {
		return
	}
	data, merr := json.Marshal(wire.RouteReport{
		Route: routeID, Time: p.cfg.Clock.Now(), Kind: ClassifyError(err), Error: err.Error(),
	})
	if merr != nil {
		p.cfg.Logger.Warn("route report not encoded", "route_id", routeID, "err", merr)
		return
	}
	if perr := p.nc.Publish(wire.RouteReportSubject(routeID), data); perr != nil {
		p.cfg.Logger.Warn("route report not published", "route_id", routeID, "err", perr)
	}
}

// Close stops following gantry_routes and closes the idle connections of
// every cached transport. It is idempotent; after it, Pick reads the bucket
// on every call.
func (p *Picker) Close() {
	p.closeOnce.Do(func() {
		_ = p.watch.Stop()
		p.stopWatch()
		select {
		case <-p.followed:
		case <-time.After(5 * time.Second):
		}
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, t := range p.transports {
		t.CloseIdleConnections()
		delete(p.transports, k)
	}
}
