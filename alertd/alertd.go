package alertd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// Defaults of Config and of the rules.
const (
	// DefaultConsumer is alertd's durable consumer on GANTRY_AUDIT.
	DefaultConsumer = "alertd"
	// DefaultCheckInterval is how often the state rules are checked.
	DefaultCheckInterval = 5 * time.Second
	// DefaultWindow is a rule's rate limit window.
	DefaultWindow = 10 * time.Minute
	// DefaultLeaderAfter is how long without a leader leader_lost waits.
	DefaultLeaderAfter = 30 * time.Second
	// MaxEventAge is how old a NEEDS_REVIEW event may be and still alert:
	// older ones (met after a long stop) are counted, not mailed one by
	// one.
	MaxEventAge = time.Hour
)

// Config configures alertd.
type Config struct {
	// Alerts are the rules and sinks of the config file's alerts section.
	Alerts config.Alerts
	// Consumer names the durable consumer of NEEDS_REVIEW events.
	// Defaults to DefaultConsumer.
	Consumer string
	// Clock tells the time of rules and rate limits. Defaults to the real
	// clock.
	Clock clock.Clock
	// Logger receives alertd's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Metrics registers alertd's Prometheus metrics. Defaults to none.
	Metrics prometheus.Registerer
}

// Alertd checks the rules of the alerts section and sends the alerts they
// raise, as events on gantry.audit.alert.<kind> and to the sinks. It
// learns everything through subjects and buckets: NEEDS_REVIEW events from
// the audit stream, running tasks from the workers' presence, routes,
// resources, the leader and auditd's consumer from the broker.
//
// It is an actor (lifecycle.Base): Run blocks until Stop or its context
// ends, and runs once; Ready is closed once it consumes; Stop ends Run,
// and is idempotent and safe before Run or after it returns. A sink that
// fails is retried in the background: it never holds the rules back.
type Alertd struct {
	lifecycle.Base
	cfg    Config
	js     jetstream.JetStream
	log    *slog.Logger
	clock  clock.Clock
	client *client.Client
	em     *audit.Emitter
	sinks  map[string]sink
	m      *metrics

	mu       sync.Mutex
	limiters map[limitKey]*limiter
	// episodes are the conditions that hold now and have alerted, by rule
	// and subject: they alert again only once they have ended.
	episodes map[limitKey]time.Time
	// seen are the running tasks already alerted, by rule and task
	// attempt.
	seen map[limitKey]bool
}

// New checks cfg and returns alertd, working through nc.
func New(cfg Config, nc *nats.Conn) (*Alertd, error) {
	if nc == nil {
		return nil, errors.New("alertd: no NATS connection")
	}
	cfg.Consumer = cmp.Or(cfg.Consumer, DefaultConsumer)
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.Alerts.CheckInterval = cmp.Or(cfg.Alerts.CheckInterval, config.Duration(DefaultCheckInterval))
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("alertd: jetstream: %w", err)
	}
	c, err := client.New(nc, client.WithComponent("alertd"), client.WithLogger(cfg.Logger))
	if err != nil {
		return nil, fmt.Errorf("alertd: %w", err)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	a := &Alertd{cfg: cfg, js: js, log: cfg.Logger, clock: cfg.Clock, client: c,
		em: audit.NewEmitter(js, "alertd", cfg.Clock), m: m, sinks: map[string]sink{},
		limiters: map[limitKey]*limiter{}, episodes: map[limitKey]time.Time{}, seen: map[limitKey]bool{}}
	for _, w := range cfg.Alerts.Webhooks {
		s, err := newWebhook(w, a.log, m)
		if err != nil {
			return nil, fmt.Errorf("alertd: %w", err)
		}
		a.sinks[w.Name] = s
	}
	for _, e := range cfg.Alerts.Email {
		s, err := newMailer(e, a.log, m)
		if err != nil {
			return nil, fmt.Errorf("alertd: %w", err)
		}
		a.sinks[e.Name] = s
	}
	return a, nil
}

// Run consumes NEEDS_REVIEW events and checks the state rules until Stop
// or ctx ends, then waits for the sinks' deliveries in flight (bounded by
// their timeouts). It returns lifecycle.ErrAlreadyRun when called again.
func (a *Alertd) Run(ctx context.Context) error {
	return lifecycle.Run(ctx, &a.Base, func(_ context.Context, lc *lifecycle.Runner) error {
		ctx := lc.StopContext()
		// Run waits for the sinks once the body has returned and ctx is
		// cancelled, whether it stopped or failed to start.
		for _, s := range a.sinks {
			lc.Go(func() { s.run(ctx) })
		}
		if a.has(config.AlertNeedsReview) {
			cc, err := a.consume(ctx)
			if err != nil {
				return err
			}
			defer cc.Stop()
		}
		lc.MarkReady()
		a.log.Info("alertd running", "rules", len(a.cfg.Alerts.Rules), "sinks", len(a.sinks))
		for clock.Sleep(ctx, a.clock, a.cfg.Alerts.CheckInterval.Std()) {
			a.check(ctx)
		}
		return nil
	})
}

// has reports whether a rule of kind is configured.
func (a *Alertd) has(kind string) bool {
	return slices.ContainsFunc(a.cfg.Alerts.Rules, func(r config.AlertRule) bool { return r.Kind == kind })
}

// consume follows the NEEDS_REVIEW events of the audit stream through a
// durable consumer, so that none is missed while alertd is stopped.
func (a *Alertd) consume(ctx context.Context) (jetstream.ConsumeContext, error) {
	cons, err := a.js.CreateOrUpdateConsumer(ctx, wire.StreamAudit, jetstream.ConsumerConfig{
		Durable:       a.cfg.Consumer,
		Description:   "alertd: NEEDS_REVIEW events for the alert rules",
		FilterSubject: wire.EventNeedsReview.Subject(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", a.cfg.Consumer, wire.StreamAudit, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev wire.Event
		if err := json.Unmarshal(m.Data(), &ev); err == nil {
			a.needsReview(ev)
		}
		_ = m.Ack()
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			a.log.Debug("consume", "err", err)
		}
	}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", wire.StreamAudit, err)
	}
	return cc, nil
}

// needsReview raises the needs_review rules' alerts for one event.
func (a *Alertd) needsReview(ev wire.Event) {
	var p struct {
		Queue string `json:"queue"`
		Type  string `json:"type"`
	}
	_ = json.Unmarshal(ev.Payload, &p)
	now := a.clock.Now()
	for _, r := range a.rules(config.AlertNeedsReview) {
		if len(r.Types) > 0 && !slices.Contains(r.Types, p.Type) {
			continue
		}
		typ := cmp.Or(p.Type, "unknown")
		al := wire.Alert{Rule: r.Name, Kind: r.Kind, Subject: typ, Since: ev.Time, TaskID: ev.TaskID, Queue: p.Queue, Type: p.Type,
			LastError: ev.Message, Summary: fmt.Sprintf("%s task %s needs review", typ, ev.TaskID)}
		if now.Sub(ev.Time) > MaxEventAge {
			al.Summary = fmt.Sprintf("%s tasks went to NEEDS_REVIEW while alertd was stopped", typ)
		}
		a.raise(r, al, now)
	}
}

// rules returns the rules of kind.
func (a *Alertd) rules(kind string) []config.AlertRule {
	var out []config.AlertRule
	for _, r := range a.cfg.Alerts.Rules {
		if r.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// limitKey is a rule and what an alert of it is about.
type limitKey struct{ rule, subject string }

// limiter holds a rule's alerts about one subject to one per window.
type limiter struct {
	last time.Time
	// held counts the occurrences since last that were not sent; first
	// is the earliest of them and latest the last one's alert.
	held   int
	first  time.Time
	latest wire.Alert
}

// raise sends al now, or holds it until the rule's window for its subject
// has passed; a held alert is sent, counted, by flush.
func (a *Alertd) raise(r config.AlertRule, al wire.Alert, now time.Time) {
	window := cmp.Or(r.Window.Std(), DefaultWindow)
	key := limitKey{r.Name, al.Subject}
	a.mu.Lock()
	l := a.limiters[key]
	if l == nil {
		l = &limiter{}
		a.limiters[key] = l
	}
	if l.held == 0 {
		l.first = al.Since
	}
	l.held++
	l.latest = al
	send := l.last.IsZero() || now.Sub(l.last) >= window
	if send {
		al.Count, al.Since = l.held, l.first
		l.last, l.held = now, 0
	}
	a.mu.Unlock()
	if send {
		a.send(r, al)
	} else {
		a.m.held.WithLabelValues(r.Name).Inc()
	}
}

// flush sends the held alerts whose window has passed.
func (a *Alertd) flush(now time.Time) {
	byName := map[string]config.AlertRule{}
	for _, r := range a.cfg.Alerts.Rules {
		byName[r.Name] = r
	}
	type due struct {
		r  config.AlertRule
		al wire.Alert
	}
	var out []due
	a.mu.Lock()
	for key, l := range a.limiters {
		r := byName[key.rule]
		if l.held == 0 || now.Sub(l.last) < cmp.Or(r.Window.Std(), DefaultWindow) {
			continue
		}
		al := l.latest
		al.Count, al.Since = l.held, l.first
		if l.held > 1 {
			al.Summary = fmt.Sprintf("%d more: %s", l.held, al.Summary)
		}
		l.last, l.held = now, 0
		out = append(out, due{r, al})
	}
	a.mu.Unlock()
	for _, d := range out {
		a.send(d.r, d.al)
	}
}

// alertTypes maps a rule kind to its event type.
var alertTypes = map[string]wire.EventType{
	config.AlertNeedsReview:   wire.EventAlertNeedsReview,
	config.AlertLongRunning:   wire.EventAlertLongRunning,
	config.AlertRouteDown:     wire.EventAlertRouteDown,
	config.AlertResourceFault: wire.EventAlertResourceFault,
	config.AlertLeaderLost:    wire.EventAlertLeaderLost,
	config.AlertAuditLag:      wire.EventAlertAuditLag,
}

// send publishes al as an event and hands the event to the rule's sinks.
func (a *Alertd) send(r config.AlertRule, al wire.Alert) {
	data, err := json.Marshal(al)
	if err != nil {
		a.log.Error("encode alert", "rule", r.Name, "err", err)
		return
	}
	ev := wire.Event{Type: alertTypes[r.Kind], Level: wire.LevelWarn, TaskID: al.TaskID, Message: al.Summary, Payload: data}
	switch r.Kind {
	case config.AlertRouteDown:
		ev.RouteID = al.Subject
	case config.AlertResourceFault:
		ev.ResourceID = al.Subject
	case config.AlertLeaderLost, config.AlertAuditLag:
		ev.Level = wire.LevelError
	}
	a.em.Stamp(&ev)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.em.Emit(ctx, ev); err != nil {
		a.log.Warn("alert event not recorded", "rule", r.Name, "err", err)
	}
	a.m.alerts.WithLabelValues(r.Name, r.Kind).Inc()
	a.log.Info("alert", "rule", r.Name, "kind", r.Kind, "subject", al.Subject, "count", al.Count, "summary", al.Summary)
	for name, s := range a.sinks {
		if len(r.Sinks) == 0 || slices.Contains(r.Sinks, name) {
			s.enqueue(ev, al)
		}
	}
}
