package healthd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
	"github.com/gantry-dev/gantry/internal/proxytest"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/kv"
)

// site is a real HTTP server on loopback answering status.
func site(t testing.TB, status int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// bundle is a broker, a running healthd and its route store.
type bundle struct {
	env   *brokertest.Env
	h     *Healthd
	store *egress.Store
}

// start runs healthd with cfg against env until the test ends.
func start(t *testing.T, env *brokertest.Env, cfg Config) *bundle {
	t.Helper()
	cfg.Logger = env.Log
	h, err := New(cfg, env.NC, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(context.Background()) }()
	t.Cleanup(func() {
		h.Stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after Stop", err)
		}
	})
	select {
	case <-h.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("healthd not ready within 10s")
	}
	store, err := egress.NewStore(context.Background(), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{env: env, h: h, store: store}
}

// waitRoute polls gantry_routes until route id satisfies ok.
func (b *bundle) waitRoute(t *testing.T, id, what string, ok func(wire.Route) bool) wire.Route {
	t.Helper()
	var r wire.Route
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		var err error
		if r, _, err = b.store.Get(context.Background(), id); err != nil || !ok(r) {
			return fmt.Errorf("route %s = %+v, %v; want it %s", id, r, err, what)
		}
		return nil
	})
	return r
}

// probe asks healthd for a probe of id through the NATS service.
func (b *bundle) probe(t *testing.T, id string) wire.RouteProbeReply {
	t.Helper()
	reply, err := b.ask(id)
	if err != nil {
		t.Fatalf("probe %s: %v", id, err)
	}
	return reply
}

// ask sends a probe request for id, as any NATS client would.
func (b *bundle) ask(id string) (wire.RouteProbeReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var reply wire.RouteProbeReply
	err := rpc.Request(ctx, b.env.NC, wire.SubjectRouteProbe, wire.RouteProbeRequest{ID: id, Apply: true}, &reply)
	return reply, err
}

func TestProbeStages(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	good := site(t, http.StatusOK)
	down := site(t, http.StatusServiceUnavailable)
	exit := proxytest.ExitServer(t, "eu-west")
	connect := proxytest.Start(t, proxytest.HTTPConnect, proxytest.WithAuth("bob", "hunter2"))
	socks := proxytest.Start(t, proxytest.SOCKS5)
	hung := proxytest.Start(t, proxytest.HTTPConnect)
	hung.SetHang(true)
	denied := proxytest.Start(t, proxytest.SOCKS5)
	denied.SetDeny(true)
	closed := proxytest.ClosedAddr(t)

	h, err := New(Config{ProbeTimeout: time.Second, Logger: env.Log}, env.NC, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		route config.Route
		stage wire.ProbeStage
		kind  wire.ErrorKind
	}{
		{"connect ok", config.Route{Proxy: connect.URL(), ProbeURL: good.URL, ExpectIP: "127.0.0.1", ExpectRegion: "EU-WEST", ExpectURL: exit.URL}, "", ""},
		{"socks5 ok", config.Route{Proxy: socks.URL(), ProbeURL: good.URL, ExpectIP: "127.0.0.1", ExpectURL: exit.URL}, "", ""},
		{"direct ok", config.Route{Proxy: "direct", ProbeURL: good.URL}, "", ""},
		{"closed proxy port", config.Route{Proxy: "socks5://" + closed, ProbeURL: good.URL}, wire.StageTCP, wire.KindRefused},
		{"closed direct port", config.Route{ProbeURL: "http://" + closed + "/"}, wire.StageTCP, wire.KindRefused},
		{"bad status", config.Route{Proxy: connect.URL(), ProbeURL: down.URL}, wire.StageRequest, wire.KindBadStatus},
		{"proxy hangs", config.Route{Proxy: hung.URL(), ProbeURL: good.URL}, wire.StageRequest, wire.KindTimeout},
		{"proxy denies", config.Route{Proxy: denied.URL(), ProbeURL: good.URL}, wire.StageRequest, wire.KindProxy},
		{"wrong exit ip", config.Route{Proxy: socks.URL(), ProbeURL: good.URL, ExpectIP: "198.51.100.7", ExpectURL: exit.URL}, wire.StageExit, wire.KindWrongExit},
		{"wrong region", config.Route{Proxy: connect.URL(), ProbeURL: good.URL, ExpectRegion: "us-east", ExpectURL: exit.URL}, wire.StageExit, wire.KindWrongExit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.route.ID = "r"
			res := h.probe(context.Background(), tc.route)
			if res.OK != (tc.kind == "") || res.Stage != tc.stage || res.Kind != tc.kind {
				t.Errorf("probe = ok %v, stage %q, kind %q (%s); want ok %v, stage %q, kind %q",
					res.OK, res.Stage, res.Kind, res.Error, tc.kind == "", tc.stage, tc.kind)
			}
			if strings.Contains(res.Error, "hunter2") {
				t.Errorf("Error = %q, want the proxy password left out", res.Error)
			}
			if tc.kind == wire.KindWrongExit && res.ExitIP != "127.0.0.1" {
				t.Errorf("ExitIP = %q, want 127.0.0.1 (what the expect URL saw)", res.ExitIP)
			}
		})
	}
}

func TestLatencyDropsScore(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	good := site(t, http.StatusOK)
	fast := proxytest.Start(t, proxytest.HTTPConnect, proxytest.WithAuth("bob", "hunter2"))
	slow := proxytest.Start(t, proxytest.SOCKS5)
	slow.SetDelay(400 * time.Millisecond)
	b := start(t, env, Config{Routes: []config.Route{
		{ID: "fast", Proxy: fast.URL(), ProbeURL: good.URL, Interval: config.Duration(time.Hour)},
		{ID: "slow", Proxy: slow.URL(), ProbeURL: good.URL, Interval: config.Duration(time.Hour)},
	}})
	rf, rs := b.probe(t, "fast"), b.probe(t, "slow")
	if rf.Result == nil || rs.Result == nil || !rf.Result.OK || !rs.Result.OK {
		t.Fatalf("probe replies = %+v, %+v; want two successes", rf, rs)
	}
	if rs.Result.LatencyMS < 400 {
		t.Errorf("slow LatencyMS = %d, want >= 400", rs.Result.LatencyMS)
	}
	if max := 100 - 400.0/20; rs.Route.Score > max {
		t.Errorf("slow Score = %v, want <= %v", rs.Route.Score, max)
	}
	if strings.Contains(rf.Route.Proxy, "hunter2") || !strings.Contains(rf.Route.Proxy, "bob:xxxxx@") {
		t.Errorf("probe reply proxy = %q, want the password redacted", rf.Route.Proxy)
	}
	if rf.Route.Score <= rs.Route.Score {
		t.Errorf("fast Score = %v, want above slow's %v", rf.Route.Score, rs.Route.Score)
	}
	st := b.waitRoute(t, "slow", "stored with its latency", func(r wire.Route) bool { return r.LatencyMS >= 400 })
	if st.Score != rs.Route.Score || st.State != wire.RouteAvailable || st.Proxy != slow.URL() {
		t.Errorf("stored slow = %+v, want the reply's score %v, AVAILABLE, proxy %s", st, rs.Route.Score, slow.URL())
	}
	var re *rpc.Error
	if _, err := b.ask("nope"); !errors.Is(err, kv.ErrNotFound) || !errors.As(err, &re) || re.Code != rpc.CodeNotFound {
		t.Errorf("probe(nope) = %v, want a 404 matching kv.ErrNotFound", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rpc.Request(ctx, b.env.NC, wire.SubjectRouteProbe, "fast", nil); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("probe with a bad body = %v, want a 400 matching kv.ErrInvalid", err)
	}
}

// events collects the audit events and health results published while a
// test runs.
type events struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func collect(t *testing.T, nc *nats.Conn, subjects ...string) *events {
	t.Helper()
	e := &events{}
	for _, s := range subjects {
		sub, err := nc.Subscribe(s, func(m *nats.Msg) {
			e.mu.Lock()
			e.msgs = append(e.msgs, m)
			e.mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return e
}

// count returns how many messages arrived on subject.
func (e *events) count(subject string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, m := range e.msgs {
		if m.Subject == subject {
			n++
		}
	}
	return n
}

func (e *events) wait(t *testing.T, subject string, n int) {
	t.Helper()
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := e.count(subject); got < n {
			return fmt.Errorf("messages on %s = %d, want %d", subject, got, n)
		}
		return nil
	})
}

// idle waits until every route loop has armed its timer, so an Advance of
// the fake clock reaches them.
func idle(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	check.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := clk.Timers(); got != n {
			return fmt.Errorf("Timers = %d, want %d", got, n)
		}
		return nil
	})
}

func TestCooldownAndRecovery(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	good := site(t, http.StatusOK)
	p := proxytest.Start(t, proxytest.HTTPConnect)
	p.SetDeny(true)
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	ev := collect(t, env.NC, wire.SubjectAuditAll, wire.SubjectHealthAll)
	b := start(t, env, Config{
		Clock: clk, CooldownBase: time.Minute, CooldownMax: 10 * time.Minute,
		Routes: []config.Route{{ID: "plant", Proxy: p.URL(), ProbeURL: good.URL, Interval: config.Duration(10 * time.Second)}},
	})
	health := wire.HealthSubject("plant")
	cooldown, recovered := wire.EventRouteCooldown.Subject(), wire.EventRouteRecovered.Subject()

	// Probes at 0s, 10s, 20s, 30s fail: the score goes 85, 70, 55, 40.
	for i, want := range []float64{85, 70, 55} {
		ev.wait(t, health, i+1)
		r := b.waitRoute(t, "plant", "probed", func(r wire.Route) bool { return r.ConsecutiveFailures == i+1 })
		if r.Score != want || r.State != wire.RouteAvailable || r.LastErrorKind != wire.KindProxy {
			t.Fatalf("after failure %d: %+v, want score %v, AVAILABLE, kind proxy", i+1, r, want)
		}
		idle(t, clk, 1)
		clk.Advance(10 * time.Second)
	}
	r := b.waitRoute(t, "plant", "in cooldown", func(r wire.Route) bool { return r.State == wire.RouteCooldown })
	t30 := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	if r.Score != 40 || !r.CooldownUntil.Equal(t30.Add(time.Minute)) || r.CooldownStreak != 1 {
		t.Fatalf("cooldown = %+v, want score 40 until 12:01:30, streak 1", r)
	}
	ev.wait(t, cooldown, 1)

	// No probe during the cooldown: 50s later the proxy has seen nothing new.
	idle(t, clk, 1)
	seen := p.Requests()
	clk.Advance(50 * time.Second)
	idle(t, clk, 1)
	if got := p.Requests(); got != seen {
		t.Errorf("proxy requests during cooldown = %d, want %d (no probe)", got, seen)
	}

	// At its end the route is probed again, still fails: a longer cooldown.
	clk.Advance(10 * time.Second)
	r = b.waitRoute(t, "plant", "in a second cooldown", func(r wire.Route) bool { return r.CooldownStreak == 2 })
	t90 := t30.Add(time.Minute)
	if r.State != wire.RouteCooldown || !r.CooldownUntil.Equal(t90.Add(2*time.Minute)) {
		t.Fatalf("second cooldown = %+v, want COOLDOWN until 12:03:30", r)
	}
	ev.wait(t, cooldown, 2)

	// The proxy heals; the probe at the cooldown's end recovers the route.
	p.SetDeny(false)
	idle(t, clk, 1)
	clk.Advance(2 * time.Minute)
	r = b.waitRoute(t, "plant", "recovered", func(r wire.Route) bool { return r.State == wire.RouteAvailable })
	if r.Score != 100 || r.CooldownUntil != nil || r.ConsecutiveSuccesses != 1 || r.LastChecked == nil || !r.LastChecked.Equal(t90.Add(2*time.Minute)) {
		t.Errorf("recovered = %+v, want score 100, no cooldown, 1 success checked at 12:03:30", r)
	}
	ev.wait(t, recovered, 1)
	if got := ev.count(cooldown); got != 2 {
		t.Errorf("ROUTE_COOLDOWN events = %d, want 2", got)
	}

	ev.mu.Lock()
	defer ev.mu.Unlock()
	var last wire.Event
	for _, m := range ev.msgs {
		if m.Subject == recovered {
			if err := json.Unmarshal(m.Data, &last); err != nil {
				t.Fatal(err)
			}
		}
	}
	if last.Type != wire.EventRouteRecovered || last.RouteID != "plant" || last.Component != "healthd" || !last.Time.Equal(t90.Add(2*time.Minute)) {
		t.Errorf("ROUTE_RECOVERED event = %+v, want route plant from healthd at the fake time", last)
	}
}

func TestReportsCountAndAutoAvoidsCooldown(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	probeSite := site(t, http.StatusOK)
	taskSite := site(t, http.StatusOK)
	healthy := proxytest.Start(t, proxytest.HTTPConnect)
	flaky := proxytest.Start(t, proxytest.SOCKS5)
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	hour := config.Duration(time.Hour)
	b := start(t, env, Config{Clock: clk, Routes: []config.Route{
		{ID: "healthy", Proxy: healthy.URL(), ProbeURL: probeSite.URL, Interval: hour},
		{ID: "flaky", Proxy: flaky.URL(), ProbeURL: probeSite.URL, Interval: hour},
	}})
	for _, id := range []string{"healthy", "flaky"} {
		b.waitRoute(t, id, "probed", func(r wire.Route) bool { return r.LastChecked != nil })
	}
	picker, err := egress.NewPicker(context.Background(), egress.PickerConfig{Clock: clk}, env.NC, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	defer picker.Close()

	// Real traffic through flaky times out three times: 100 − 45 − 30 = 25.
	for range 3 {
		picker.Report(context.Background(), "flaky", context.DeadlineExceeded)
	}
	r := b.waitRoute(t, "flaky", "in cooldown", func(r wire.Route) bool { return r.State == wire.RouteCooldown })
	if r.Score != 25 || r.ConsecutiveFailures != 3 || r.RecentTimeouts != 3 || r.LastErrorKind != wire.KindTimeout {
		t.Errorf("flaky = %+v, want score 25, 3 failures, 3 recent timeouts, kind timeout", r)
	}

	// The picker's view follows the bucket within moments; from then on
	// route auto goes through healthy, never flaky.
	check.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		r, err := picker.Pick(context.Background(), wire.RouteAuto)
		if err != nil || r.ID != "healthy" {
			return fmt.Errorf("Pick(auto) = %q, %v; want healthy", r.ID, err)
		}
		return nil
	})
	target := strings.TrimPrefix(taskSite.URL, "http://")
	for range 5 {
		rt, id, err := picker.Transport(context.Background(), wire.RouteAuto)
		if err != nil {
			t.Fatal(err)
		}
		if id != "healthy" {
			t.Errorf("auto picked %q, want healthy", id)
		}
		req, _ := http.NewRequest(http.MethodGet, taskSite.URL, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if got := healthy.TunnelsTo(target); got < 1 {
		t.Errorf("healthy proxy tunnels to the task's site = %d, want >= 1", got)
	}
	if got := flaky.TunnelsTo(target); got != 0 {
		t.Errorf("flaky proxy tunnels to the task's site = %d, want 0", got)
	}
	var ue *egress.UnavailableError
	if _, _, err := picker.Transport(context.Background(), "flaky"); err == nil || !asUnavailable(err, &ue) || ue.RetryAfter() != time.Minute {
		t.Errorf("Transport(flaky) = %v, want a retry after the 1m cooldown", err)
	}
}

func asUnavailable(err error, ue **egress.UnavailableError) bool {
	e, ok := err.(*egress.UnavailableError)
	*ue = e
	return ok
}

func TestRemovedRouteDisabled(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	store, err := egress.NewStore(context.Background(), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(context.Background(), wire.Route{ID: "gone", State: wire.RouteAvailable, Score: 99, Proxy: "direct"}); err != nil {
		t.Fatal(err)
	}
	until := time.Date(2026, 11, 30, 12, 5, 0, 0, time.UTC)
	if _, err := store.Put(context.Background(), wire.Route{ID: "kept", State: wire.RouteCooldown, Score: 10, CooldownUntil: &until, CooldownStreak: 3}); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := start(t, env, Config{Clock: clk, Routes: []config.Route{
		{ID: "kept", ProbeURL: site(t, http.StatusOK).URL},
	}})
	b.waitRoute(t, "gone", "disabled", func(r wire.Route) bool { return r.State == wire.RouteDisabled })
	r := b.waitRoute(t, "kept", "loaded", func(r wire.Route) bool { return r.Proxy == "direct" })
	if r.State != wire.RouteCooldown || r.CooldownStreak != 3 || r.LastChecked != nil {
		t.Errorf("kept = %+v, want its stored cooldown honoured, not probed yet", r)
	}
	idle(t, clk, 1)
	clk.Set(until)
	r = b.waitRoute(t, "kept", "recovered", func(r wire.Route) bool { return r.State == wire.RouteAvailable })
	if r.LastChecked == nil || !r.LastChecked.Equal(until) {
		t.Errorf("kept LastChecked = %v, want probed when the stored cooldown ended", r.LastChecked)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	probeURL := site(t, http.StatusOK).URL
	newHealthd := func(t testing.TB, env *brokertest.Env) *Healthd {
		h, err := New(Config{Logger: env.Log, Routes: []config.Route{{ID: "r1", ProbeURL: probeURL}}}, env.NC, env.JS)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	t.Run("misuse", func(t *testing.T) {
		lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor { return newHealthd(t, env) })
	})
	t.Run("failed start", func(t *testing.T) {
		// A broker of its own, without the routes bucket.
		env := brokertest.Start(t)
		if err := env.JS.DeleteKeyValue(context.Background(), wire.BucketRoutes); err != nil {
			t.Fatal(err)
		}
		lifecycletest.FailedStart(t, newHealthd(t, env))
	})
}

// TestManualProbeReportsOnly: a probe asked for without apply reports its
// outcome and leaves the route's counters, cooldown and schedule alone; with
// apply it counts like a scheduled probe.
func TestManualProbeReportsOnly(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	good := site(t, http.StatusOK)
	p := proxytest.Start(t, proxytest.HTTPConnect)
	p.SetDeny(true)
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	b := start(t, env, Config{
		Clock: clk, CooldownBase: time.Minute,
		Routes: []config.Route{{ID: "plant", Proxy: p.URL(), ProbeURL: good.URL, Interval: config.Duration(time.Hour)}},
	})
	b.waitRoute(t, "plant", "probed at start", func(r wire.Route) bool { return r.ConsecutiveFailures == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for range 4 {
		var reply wire.RouteProbeReply
		if err := rpc.Request(ctx, env.NC, wire.SubjectRouteProbe, wire.RouteProbeRequest{ID: "plant"}, &reply); err != nil {
			t.Fatal(err)
		}
		if reply.Result.OK || reply.Route.ConsecutiveFailures != 1 || reply.Route.State != wire.RouteAvailable {
			t.Fatalf("manual probe = result ok %v, route %+v; want a failed result, the route unchanged", reply.Result.OK, reply.Route)
		}
	}
	reply := b.probe(t, "plant") // with apply
	if reply.Route.ConsecutiveFailures != 2 {
		t.Errorf("applied probe: consecutive failures = %d, want 2", reply.Route.ConsecutiveFailures)
	}
}
