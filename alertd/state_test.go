package alertd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/lease"
)

// stateInterval is the state tests' check interval, on their fake clock.
const stateInterval = time.Second

// tick lets alertd's check loop run one check d of fake time from now (d
// at least stateInterval): it waits for the loop's timer, moves the clock
// past it, and returns once the check has run and the next timer is armed.
func tick(t *testing.T, clk *clock.Fake, d time.Duration) {
	t.Helper()
	armed := func() bool { return clk.Timers() == 1 }
	check.That(t, 10*time.Second, "alertd's check timer armed", armed)
	clk.Advance(d)
	check.That(t, 10*time.Second, "the check run and the next timer armed", armed)
}

// auditEvents reads every event of type typ in the audit stream.
func auditEvents(t *testing.T, env *brokertest.Env, typ wire.EventType) []wire.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := env.JS.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(typ.Subject()))
	if err != nil {
		t.Fatal(err)
	}
	var out []wire.Event
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != typ.Subject() {
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("event %s: %v", m.Data, err)
		}
		out = append(out, ev)
	}
	return out
}

// stateCase is a state rule and a condition of the world it watches,
// made to hold and to end for real.
type stateCase struct {
	name string
	rule config.AlertRule
	// event is the alert's type; subject what it is about.
	event   wire.EventType
	subject string
	// after is how long the condition must hold before it alerts.
	after time.Duration
	// start builds a world in which the condition does not hold, and
	// returns what makes it hold (true) or end (false).
	start func(t *testing.T, env *brokertest.Env) func(holds bool)
	// check checks what is particular to the rule's alert events.
	check func(ev wire.Event, al wire.Alert) error
}

func stateCases() []stateCase {
	ctx := context.Background()
	return []stateCase{{
		name:    "route_down",
		rule:    config.AlertRule{Name: "route", Kind: config.AlertRouteDown, After: config.Duration(time.Minute)},
		event:   wire.EventAlertRouteDown,
		subject: "plant-proxy",
		after:   time.Minute,
		start: func(t *testing.T, env *brokertest.Env) func(bool) {
			store, err := egress.NewStore(ctx, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			put := func(r wire.Route) {
				if _, err := store.Put(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			// A route in service and one taken out of it on purpose
			// never alert.
			put(wire.Route{ID: "office", State: wire.RouteAvailable, Score: 99})
			put(wire.Route{ID: "spare", State: wire.RouteDisabled})
			put(wire.Route{ID: "plant-proxy", State: wire.RouteAvailable, Score: 95})
			// It cools down, the first time; it faults, the second.
			down := []wire.RouteState{wire.RouteCooldown, wire.RouteFault}
			return func(holds bool) {
				if !holds {
					put(wire.Route{ID: "plant-proxy", State: wire.RouteAvailable, Score: 80})
					return
				}
				put(wire.Route{ID: "plant-proxy", State: down[0], Score: 12, LastError: "connection refused", ConsecutiveFailures: 4})
				down = down[1:]
			}
		},
		check: func(ev wire.Event, al wire.Alert) error {
			var d struct {
				State     wire.RouteState `json:"state"`
				LastError string          `json:"last_error"`
			}
			if err := json.Unmarshal(al.Details, &d); err != nil || ev.RouteID != "plant-proxy" || d.LastError != "connection refused" ||
				(d.State != wire.RouteCooldown && d.State != wire.RouteFault) {
				return fmt.Errorf("route_id %q, details %s; want plant-proxy, COOLDOWN or FAULT, its last error", ev.RouteID, al.Details)
			}
			return nil
		},
	}, {
		name:    "resource_fault",
		rule:    config.AlertRule{Name: "fault", Kind: config.AlertResourceFault},
		event:   wire.EventAlertResourceFault,
		subject: "cam1",
		start: func(t *testing.T, env *brokertest.Env) func(bool) {
			res, err := lease.NewResources(env.JS, lease.ResourcesConfig{Audit: audit.NewEmitter(env.JS, "workers", nil), Logger: env.Log})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"cam1", "cam2"} {
				if _, err := res.Add(ctx, lease.ResourceSpec{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			return func(holds bool) {
				if !holds {
					if _, err := res.Enable(ctx, "cam1", "camera replaced"); err != nil {
						t.Fatal(err)
					}
					return
				}
				// A task's work on the camera ends in a fault, as a worker
				// records it.
				h, err := res.Lease(ctx, "cam1", "w1/task-1", 30*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.Finish(ctx, lease.OutcomeOf(lease.Fault(errors.New("camera not responding")))); err != nil {
					t.Fatal(err)
				}
			}
		},
		check: func(ev wire.Event, al wire.Alert) error {
			if ev.ResourceID != "cam1" || !strings.Contains(al.Summary, "camera not responding") {
				return fmt.Errorf("resource_id %q, summary %q; want cam1 and its last error", ev.ResourceID, al.Summary)
			}
			return nil
		},
	}, {
		name:    "leader_lost",
		rule:    config.AlertRule{Name: "leader", Kind: config.AlertLeaderLost},
		event:   wire.EventAlertLeaderLost,
		subject: "scheduler",
		after:   DefaultLeaderAfter,
		start: func(t *testing.T, env *brokertest.Env) func(bool) {
			st, err := jobs.NewSchedulerStore(ctx, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			// The leader key, as a scheduler keeps it; real time runs
			// out of its TTL only after the test.
			var rev uint64
			lead := func() {
				if _, rev, err = st.Campaign(ctx, "sched-a", "plant-pc", time.Now(), 10*time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			lead()
			return func(holds bool) {
				if !holds {
					lead()
					return
				}
				if err := st.Resign(ctx, rev); err != nil {
					t.Fatal(err)
				}
			}
		},
		check: func(ev wire.Event, _ wire.Alert) error {
			if ev.Level != wire.LevelError {
				return fmt.Errorf("level %s, want error", ev.Level)
			}
			return nil
		},
	}, {
		name:    "audit_lag",
		rule:    config.AlertRule{Name: "lag", Kind: config.AlertAuditLag, MaxPending: 3},
		event:   wire.EventAlertAuditLag,
		subject: "auditd",
		start: func(t *testing.T, env *brokertest.Env) func(bool) {
			// auditd's durable consumer, with no auditd reading it: the
			// events published pile up on it until the test catches up.
			cons, err := env.JS.CreateConsumer(ctx, wire.StreamAudit, jetstream.ConsumerConfig{
				Durable: wire.AuditConsumer, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
			if err != nil {
				t.Fatal(err)
			}
			em := audit.NewEmitter(env.JS, "workers", nil)
			n := 0
			return func(holds bool) {
				if holds {
					for range 4 {
						n++
						if err := em.Emit(ctx, wire.Event{Type: wire.EventTaskCreated, TaskID: fmt.Sprintf("task-%d", n)}); err != nil {
							t.Fatal(err)
						}
					}
					return
				}
				// Catch up, as auditd does: every event stored and acked.
				check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
					batch, err := cons.FetchNoWait(100)
					if err != nil {
						return err
					}
					for m := range batch.Messages() {
						if err := m.DoubleAck(ctx); err != nil {
							return err
						}
					}
					info, err := cons.Info(ctx)
					if err != nil {
						return err
					}
					if info.NumPending+uint64(info.NumAckPending) > 0 {
						return fmt.Errorf("auditd's consumer: %d pending, %d unacked; want none", info.NumPending, info.NumAckPending)
					}
					return nil
				})
			}
		},
		check: func(ev wire.Event, al wire.Alert) error {
			var lag struct {
				Pending uint64 `json:"pending"`
			}
			if err := json.Unmarshal(al.Details, &lag); err != nil || lag.Pending < 4 || ev.Level != wire.LevelError {
				return fmt.Errorf("level %s, details %s; want error, at least 4 pending", ev.Level, al.Details)
			}
			return nil
		},
	}}
}

// TestStateRulesAlertOncePerEpisode makes each state rule's condition
// hold for real (a route record out of service, a resource in FAULT, no
// scheduler leader key, auditd's consumer behind), and checks that it
// raises one alert event on gantry.audit.alert.<kind>, one webhook call
// and one mail once it has held for the rule's after; none again however
// many checks later while it holds (the window is shorter than a check);
// and a second one only after it has ended and held again.
func TestStateRulesAlertOncePerEpisode(t *testing.T) {
	t.Parallel()
	for _, tc := range stateCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			smtpd := startSMTP(t, "ops", "pw")
			h := startHook(t, "hook-secret")
			rule := tc.rule
			rule.Window = config.Duration(stateInterval / 2)
			clk := clock.NewFake(time.Now())
			env, _, reg := setup(t, Config{Clock: clk, Alerts: config.Alerts{
				CheckInterval: config.Duration(stateInterval),
				Rules:         []config.AlertRule{rule},
				Webhooks:      []config.Webhook{{Name: "hook", URL: h.srv.URL, Secret: "hook-secret"}},
				Email: []config.Email{{Name: "mail", Host: "127.0.0.1", Port: smtpd.addr.Port, Username: "ops", Password: "pw",
					From: "gantry@plant.example", To: []string{"ops@plant.example"}, CAFile: smtpd.caFile}},
			}})
			alerts := func(want int) []wire.Event {
				t.Helper()
				evs := auditEvents(t, env, tc.event)
				if len(evs) != want {
					t.Fatalf("%s events = %d, want %d", tc.event, len(evs), want)
				}
				if got := sum(t, reg, "gantry_alertd_alerts_total"); got != float64(want) {
					t.Fatalf("gantry_alertd_alerts_total = %v, want %d", got, want)
				}
				return evs
			}
			delivered := func(want int) {
				t.Helper()
				check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
					if m, c := len(smtpd.received()), len(h.received()); m != want || c != want {
						return fmt.Errorf("mails = %d, webhook calls = %d, want %d of each", m, c, want)
					}
					return nil
				})
			}
			// holdFor makes the condition hold and runs the checks that
			// take it to its alert, with before alerts so far: the first
			// sees it, and with an after, a check just short of it and
			// one at it.
			holdFor := func(set func(bool), before int) {
				set(true)
				tick(t, clk, stateInterval)
				if tc.after > 0 {
					alerts(before)
					tick(t, clk, tc.after-stateInterval)
					alerts(before)
					tick(t, clk, stateInterval)
				}
			}

			set := tc.start(t, env)
			tick(t, clk, stateInterval)
			alerts(0)

			holdFor(set, 0)
			alerts(1)
			delivered(1)
			// It still holds, check after check, each past the window.
			for range 3 {
				tick(t, clk, stateInterval)
			}
			alerts(1)

			// It ends, and holds again: a new episode, a new alert.
			set(false)
			tick(t, clk, stateInterval)
			alerts(1)
			holdFor(set, 1)
			evs := alerts(2)
			delivered(2)

			for i, ev := range evs {
				var al wire.Alert
				if err := json.Unmarshal(ev.Payload, &al); err != nil {
					t.Fatalf("alert %d payload %s: %v", i, ev.Payload, err)
				}
				if al.Rule != rule.Name || al.Kind != rule.Kind || al.Subject != tc.subject || al.Count != 1 || ev.Component != "alertd" {
					t.Errorf("alert %d = %+v from %s; want rule %s, kind %s, subject %s, count 1, from alertd", i, al, ev.Component, rule.Name, rule.Kind, tc.subject)
				}
				if err := tc.check(ev, al); err != nil {
					t.Errorf("alert %d: %v", i, err)
				}
			}
			var calls []string
			for _, c := range h.received() {
				if !c.validSig || c.event.Type != tc.event {
					t.Errorf("webhook call %s, signature valid %v; want %s, signed", c.event.Type, c.validSig, tc.event)
				}
				calls = append(calls, c.delivery)
			}
			want := []string{evs[0].ID, evs[1].ID}
			slices.Sort(calls)
			slices.Sort(want)
			if !slices.Equal(calls, want) {
				t.Errorf("webhook deliveries = %v, want the alert events %v", calls, want)
			}
			for _, m := range smtpd.received() {
				if !strings.Contains(m.data, "rule:    "+rule.Name+" ("+rule.Kind+")") || !strings.Contains(m.data, "about:   "+tc.subject) {
					t.Errorf("mail lacks the rule %s and subject %s:\n%s", rule.Name, tc.subject, m.data)
				}
			}
		})
	}
}
