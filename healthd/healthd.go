package healthd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/lifecycle"
	"github.com/gantry-dev/gantry/internal/rpc"
)

// QueueGroup is the queue group healthd subscribes to reports and answers
// probe requests in, so that each is handled once.
const QueueGroup = "gantry-healthd"

// Config configures healthd.
type Config struct {
	// Routes are the routes to probe, from the config file. Routes in
	// gantry_routes that are not among them are marked DISABLED.
	Routes []config.Route
	// Threshold is the score below which a route goes to COOLDOWN.
	// Defaults to 50.
	Threshold float64
	// CooldownBase is the first cooldown's length; each further cooldown
	// in a row doubles it. Defaults to 1m.
	CooldownBase time.Duration
	// CooldownMax caps a cooldown's length. Defaults to 30m.
	CooldownMax time.Duration
	// TimeoutWindow is how long a timeout counts as recent. Defaults to
	// 10m.
	TimeoutWindow time.Duration
	// StableAfter is how many successes in a row end a streak of
	// cooldowns, so the next cooldown is short again. Defaults to 3.
	StableAfter int
	// ProbeTimeout bounds one probe, all three stages. Defaults to 10s.
	ProbeTimeout time.Duration
	// Dialer makes the first hop of every probe connection. Defaults to a
	// net.Dialer.
	Dialer *net.Dialer
	// Clock tells the time for intervals, cooldowns and latency. Defaults
	// to the real clock.
	Clock clock.Clock
	// Logger receives healthd's log; it adds component=healthd. Defaults
	// to discarding.
	Logger *slog.Logger
}

// Healthd probes egress routes and keeps their health in gantry_routes.
//
// It is an actor (lifecycle.Base): Run blocks until Stop or its context
// ends, and runs once; Ready is closed once healthd has written every
// route's initial state and answers reports and probe requests; Stop ends
// Run, and is idempotent and safe before Run or after it returns.
type Healthd struct {
	lifecycle.Base
	cfg    Config
	policy policy
	nc     *nats.Conn
	js     jetstream.JetStream
	audit  *audit.Emitter
	log    *slog.Logger

	routes map[string]*route
	store  *egress.Store
}

// route is one probed route, owned by its loop goroutine.
type route struct {
	spec    config.Route
	state   wire.Route
	reports chan wire.RouteReport
	probes  chan probeRequest
}

// New validates cfg and fills its defaults.
func New(cfg Config, nc *nats.Conn, js jetstream.JetStream) (*Healthd, error) {
	if nc == nil || js == nil {
		return nil, errors.New("healthd: needs a NATS connection and JetStream")
	}
	cfg.Threshold = cmp.Or(cfg.Threshold, 50)
	cfg.CooldownBase = cmp.Or(cfg.CooldownBase, time.Minute)
	cfg.CooldownMax = cmp.Or(cfg.CooldownMax, 30*time.Minute)
	cfg.TimeoutWindow = cmp.Or(cfg.TimeoutWindow, 10*time.Minute)
	cfg.StableAfter = cmp.Or(cfg.StableAfter, 3)
	cfg.ProbeTimeout = cmp.Or(cfg.ProbeTimeout, 10*time.Second)
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{}
	}
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Threshold < 0 || cfg.Threshold > 100:
		return nil, fmt.Errorf("healthd: threshold %v outside 0..100", cfg.Threshold)
	case cfg.CooldownBase < 0 || cfg.CooldownMax < cfg.CooldownBase:
		return nil, fmt.Errorf("healthd: cooldown base %v and max %v: want 0 < base <= max", cfg.CooldownBase, cfg.CooldownMax)
	case cfg.ProbeTimeout < 0 || cfg.TimeoutWindow < 0 || cfg.StableAfter < 0:
		return nil, errors.New("healthd: negative probe timeout, timeout window or stable-after")
	}
	routes := make(map[string]*route, len(cfg.Routes))
	for _, r := range cfg.Routes {
		if _, dup := routes[r.ID]; dup {
			return nil, fmt.Errorf("healthd: duplicate route %q", r.ID)
		}
		if !wire.ValidToken(r.ID) || r.ProbeURL == "" {
			return nil, fmt.Errorf("healthd: route %q needs a valid id and a probe_url", r.ID)
		}
		if _, err := egress.ProxyAddr(r.ProxyOrDirect()); err != nil {
			return nil, fmt.Errorf("healthd: route %q: %w", r.ID, err)
		}
		r.Interval = cmp.Or(r.Interval, config.Duration(config.DefaultRouteInterval))
		routes[r.ID] = &route{
			spec:    r,
			reports: make(chan wire.RouteReport, 64),
			probes:  make(chan probeRequest),
		}
	}
	return &Healthd{
		cfg: cfg,
		policy: policy{
			threshold: cfg.Threshold, cooldownBase: cfg.CooldownBase, cooldownMax: cfg.CooldownMax,
			timeoutWindow: cfg.TimeoutWindow, stableAfter: cfg.StableAfter,
		},
		nc:     nc,
		js:     js,
		audit:  audit.NewEmitter(js, "healthd", cfg.Clock),
		log:    cfg.Logger.With("component", "healthd"),
		routes: routes,
	}, nil
}

// Run loads the routes' state, probes each route on its interval and
// answers reports and probe requests until Stop or ctx ends. It returns nil
// on a clean stop, and lifecycle.ErrAlreadyRun when called again.
func (h *Healthd) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &h.Base, func(_ context.Context, lc *lifecycle.Runner) error {
		return h.run(lc.StopContext(), lc)
	})
}

// run is Run's body: its route loops and probe handlers run on lc, which
// waits for them when run returns.
func (h *Healthd) run(ctx context.Context, lc *lifecycle.Runner) error {
	store, err := egress.NewStore(ctx, h.js)
	if err != nil {
		return h.stopped(ctx, err)
	}
	h.store = store
	if err := h.load(ctx); err != nil {
		return h.stopped(ctx, err)
	}
	reports, err := h.nc.QueueSubscribe(wire.SubjectRouteReportAll, QueueGroup, func(m *nats.Msg) { h.onReport(ctx, m) })
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", wire.SubjectRouteReportAll, err)
	}
	defer func() { _ = reports.Unsubscribe() }()
	probes, err := rpc.AddService(h.nc, wire.HealthServiceName, "gantry healthd: probe an egress route now", rpc.Endpoint{
		Name: "probe", Subject: wire.SubjectRouteProbe, QueueGroup: QueueGroup,
		Handler: func(req micro.Request) {
			// A request that arrives once run has returned starts nothing.
			// The probe answers later, from its route's loop: detached.
			req = rpc.Detach(h.nc, req)
			lc.Go(func() { h.onProbe(ctx, req) })
		},
	})
	if err != nil {
		return err
	}
	defer func() { _ = probes.Stop() }()
	if err := h.nc.Flush(); err != nil {
		return fmt.Errorf("flush subscriptions: %w", err)
	}
	for _, r := range h.routes {
		lc.Go(func() { h.loop(ctx, r) })
	}
	h.log.Info("healthd running", "routes", len(h.routes))
	lc.MarkReady()
	<-ctx.Done()
	return nil
}

// stopped turns an error seen while starting into nil when it is only the
// consequence of a stop.
func (h *Healthd) stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// load merges the stored state of every configured route with its config,
// writes it back, and disables stored routes the config no longer has.
func (h *Healthd) load(ctx context.Context) error {
	stored, err := h.store.List(ctx)
	if err != nil {
		return err
	}
	byID := make(map[string]wire.Route, len(stored))
	for _, r := range stored {
		byID[r.ID] = r
	}
	for id, r := range h.routes {
		st, ok := byID[id]
		switch {
		case !ok:
			st = wire.Route{ID: id, State: wire.RouteAvailable, Score: 100}
		case st.State != wire.RouteCooldown:
			st.State = wire.RouteAvailable
		}
		st.Proxy = r.spec.ProxyOrDirect()
		r.state = st
		if _, err := h.store.Put(ctx, st); err != nil {
			return err
		}
	}
	for _, st := range stored {
		if _, ok := h.routes[st.ID]; ok || st.State == wire.RouteDisabled {
			continue
		}
		st.State = wire.RouteDisabled
		st.CooldownUntil = nil
		if _, err := h.store.Put(ctx, st); err != nil {
			return err
		}
		h.log.Info("route disabled: not in the config", "route_id", st.ID)
	}
	return nil
}

// next is how long route r waits for its next probe: until its cooldown
// ends, or its interval after its last check (at once if never checked).
func (h *Healthd) next(r *route) time.Duration {
	now := h.cfg.Clock.Now()
	if r.state.State == wire.RouteCooldown && r.state.CooldownUntil != nil {
		return max(r.state.CooldownUntil.Sub(now), 0)
	}
	if r.state.LastChecked == nil {
		return 0
	}
	return max(r.state.LastChecked.Add(r.spec.Interval.Std()).Sub(now), 0)
}

// loop owns route r: it probes it when due, applies reports and answers
// probe requests, one at a time.
func (h *Healthd) loop(ctx context.Context, r *route) {
	timer := h.cfg.Clock.NewTimer(h.next(r))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
			h.probeNow(ctx, r)
		case rep := <-r.reports:
			h.record(ctx, r, outcome{kind: rep.Kind, err: rep.Error}, nil)
		case req := <-r.probes:
			var res wire.HealthResult
			if req.apply {
				res = h.probeNow(ctx, r)
			} else {
				// Only a report: the route's state and schedule stay.
				res = h.probe(ctx, r.spec)
				res.State, res.Score = r.state.State, r.state.Score
			}
			st := r.state
			st.Proxy = wire.RedactProxy(st.Proxy)
			req.reply <- wire.RouteProbeReply{Result: &res, Route: &st}
		}
		timer.Stop()
		timer.Reset(h.next(r))
	}
}

// probeNow probes r, records the outcome and publishes the result.
func (h *Healthd) probeNow(ctx context.Context, r *route) wire.HealthResult {
	res := h.probe(ctx, r.spec)
	if ctx.Err() != nil {
		return res
	}
	o := outcome{
		ok: res.OK, kind: res.Kind, err: res.Error, probe: true,
		latencyMS: res.LatencyMS, measured: res.OK || res.Kind == wire.KindBadStatus || res.Stage == wire.StageExit,
	}
	h.record(ctx, r, o, &res)
	res.State, res.Score = r.state.State, r.state.Score
	data, err := json.Marshal(res)
	if err == nil {
		err = h.nc.Publish(wire.HealthSubject(r.spec.ID), data)
	}
	if err != nil {
		h.log.Warn("health result not published", "route_id", r.spec.ID, "err", err)
	}
	h.log.Debug("route probed", "route_id", r.spec.ID, "ok", res.OK, "stage", res.Stage, "kind", res.Kind,
		"latency_ms", res.LatencyMS, "score", r.state.Score, "state", r.state.State)
	return res
}

// record applies o to r, stores the new state and emits the audit event
// of a transition.
func (h *Healthd) record(ctx context.Context, r *route, o outcome, res *wire.HealthResult) {
	now := h.cfg.Clock.Now()
	tr := h.policy.apply(&r.state, o, now)
	if _, err := h.store.Put(ctx, r.state); err != nil && ctx.Err() == nil {
		h.log.Error("route state not stored", "route_id", r.spec.ID, "err", err)
	}
	st := r.state
	switch tr {
	case cooledDown:
		h.log.Warn("route cooldown", "route_id", st.ID, "score", st.Score, "until", st.CooldownUntil, "err", st.LastError)
		h.emit(ctx, wire.Event{
			Type: wire.EventRouteCooldown, Level: wire.LevelWarn, RouteID: st.ID,
			Message: fmt.Sprintf("route %s in cooldown until %s (score %.2f)", st.ID, st.CooldownUntil.Format(time.RFC3339), st.Score),
			Payload: audit.Payload(map[string]any{
				"score": st.Score, "cooldown_until": st.CooldownUntil, "cooldown_streak": st.CooldownStreak,
				"consecutive_failures": st.ConsecutiveFailures, "recent_timeouts": st.RecentTimeouts,
				"last_error": st.LastError, "last_error_kind": st.LastErrorKind, "probe": res != nil,
			}),
		})
	case recovered:
		h.log.Info("route recovered", "route_id", st.ID, "score", st.Score)
		h.emit(ctx, wire.Event{
			Type: wire.EventRouteRecovered, Level: wire.LevelInfo, RouteID: st.ID,
			Message: fmt.Sprintf("route %s AVAILABLE again (score %.2f)", st.ID, st.Score),
			Payload: audit.Payload(map[string]any{"score": st.Score, "latency_ms": st.LatencyMS}),
		})
	}
}

func (h *Healthd) emit(ctx context.Context, ev wire.Event) {
	if err := h.audit.Emit(ctx, ev); err != nil && ctx.Err() == nil {
		h.log.Error("audit event not published", "type", ev.Type, "route_id", ev.RouteID, "err", err)
	}
}

// onReport hands a report of failed real traffic to its route's loop,
// unless ctx (Run stopping) is done.
func (h *Healthd) onReport(ctx context.Context, m *nats.Msg) {
	var rep wire.RouteReport
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		h.log.Warn("route report rejected: not JSON", "subject", m.Subject, "err", err)
		return
	}
	id := m.Subject[len(wire.SubjectRouteReportPrefix)+1:]
	r, ok := h.routes[id]
	if !ok {
		h.log.Debug("route report for an unknown route", "route_id", id)
		return
	}
	rep.Kind = cmp.Or(rep.Kind, wire.KindOther)
	select {
	case r.reports <- rep:
	case <-ctx.Done():
	default:
		h.log.Warn("route report dropped: route busy", "route_id", id)
	}
}

// probeRequest is a probe asked for on SubjectRouteProbe, handed to its
// route's loop.
type probeRequest struct {
	// apply records the outcome like a scheduled probe's.
	apply bool
	reply chan<- wire.RouteProbeReply
}

// onProbe answers a probe request from its route's loop.
func (h *Healthd) onProbe(ctx context.Context, req micro.Request) {
	var in wire.RouteProbeRequest
	if err := rpc.Decode(req, &in); err != nil {
		h.respond(req, nil, err)
		return
	}
	r, ok := h.routes[in.ID]
	if !ok {
		h.respond(req, nil, fmt.Errorf("route %q is not among healthd's routes: %w", in.ID, egress.ErrNotFound))
		return
	}
	ch := make(chan wire.RouteProbeReply, 1)
	select {
	case r.probes <- probeRequest{apply: in.Apply, reply: ch}:
	case <-ctx.Done():
		return
	}
	select {
	case reply := <-ch:
		h.respond(req, reply, nil)
	case <-ctx.Done():
	}
}

func (h *Healthd) respond(req micro.Request, reply any, err error) {
	if err := rpc.Respond(req, reply, err); err != nil {
		h.log.Warn("probe reply not sent", "err", err)
	}
}
