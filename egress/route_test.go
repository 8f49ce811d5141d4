package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

func target(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, rt http.RoundTripper, url string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestRouteTransport(t *testing.T) {
	t.Parallel()
	srv := target(t)
	for _, tc := range []struct {
		name string
		kind proxytest.Kind
		opts []proxytest.Option
	}{
		{"connect", proxytest.HTTPConnect, nil},
		{"connect auth", proxytest.HTTPConnect, []proxytest.Option{proxytest.WithAuth("bob", "hunter2")}},
		{"socks5", proxytest.SOCKS5, nil},
		{"socks5 auth", proxytest.SOCKS5, []proxytest.Option{proxytest.WithAuth("bob", "hunter2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := proxytest.Start(t, tc.kind, tc.opts...)
			tr, err := NewTransport(p.URL(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.CloseIdleConnections()
			body, err := get(t, tr, srv.URL)
			if err != nil {
				t.Fatalf("GET through %s: %v", tc.name, err)
			}
			if body != "hello" {
				t.Errorf("body = %q, want %q", body, "hello")
			}
			if got := p.Tunnels(); got != 1 {
				t.Errorf("Tunnels = %d, want 1", got)
			}
		})
	}
}

func TestRouteTransportTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "secure")
	}))
	t.Cleanup(srv.Close)
	for _, kind := range []proxytest.Kind{proxytest.HTTPConnect, proxytest.SOCKS5} {
		p := proxytest.Start(t, kind)
		tr, err := NewTransport(p.URL(), nil)
		if err != nil {
			t.Fatal(err)
		}
		tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
		body, err := get(t, tr, srv.URL)
		tr.CloseIdleConnections()
		if err != nil || body != "secure" {
			t.Errorf("GET %s through %s = %q, %v; want %q", srv.URL, p.URL(), body, err, "secure")
		}
		if got := p.TunnelsTo(srv.Listener.Addr().String()); got != 1 {
			t.Errorf("tunnels to the TLS server through %s = %d, want 1", p.URL(), got)
		}
	}
}

func TestRouteTransportErrors(t *testing.T) {
	t.Parallel()
	srv := target(t)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(tlsSrv.Close)
	closed := proxytest.ClosedAddr(t)
	for _, tc := range []struct {
		name  string
		proxy func(t *testing.T) string
		want  wire.ErrorKind
		// tls sends the request to an https target: CONNECT, not
		// forwarding, through an HTTP proxy.
		tls bool
	}{
		{"connect closed port", func(*testing.T) string { return "http://" + closed }, wire.KindRefused, false},
		{"socks5 closed port", func(*testing.T) string { return "socks5://" + closed }, wire.KindRefused, false},
		{"connect denied", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.HTTPConnect)
			p.SetDeny(true)
			return p.URL()
		}, wire.KindProxy, false},
		{"connect bad password", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.HTTPConnect, proxytest.WithAuth("bob", "hunter2"))
			return "http://bob:wrong@" + p.Addr()
		}, wire.KindProxy, false},
		{"connect denied, https target", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.HTTPConnect)
			p.SetDeny(true)
			return p.URL()
		}, wire.KindProxy, true},
		{"connect bad password, https target", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.HTTPConnect, proxytest.WithAuth("bob", "hunter2"))
			return "http://bob:wrong@" + p.Addr()
		}, wire.KindProxy, true},
		{"connect hangs, https target", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.HTTPConnect)
			p.SetHang(true)
			return p.URL()
		}, wire.KindTimeout, true},
		{"socks5 denied, https target", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.SOCKS5)
			p.SetDeny(true)
			return p.URL()
		}, wire.KindProxy, true},
		{"socks5 bad password", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.SOCKS5, proxytest.WithAuth("bob", "hunter2"))
			return "socks5://bob:wrong@" + p.Addr()
		}, wire.KindProxy, false},
		{"socks5 denied", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.SOCKS5)
			p.SetDeny(true)
			return p.URL()
		}, wire.KindProxy, false},
		{"connect hangs", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.HTTPConnect)
			p.SetHang(true)
			return p.URL()
		}, wire.KindTimeout, false},
		{"socks5 hangs", func(t *testing.T) string {
			p := proxytest.Start(t, proxytest.SOCKS5)
			p.SetHang(true)
			return p.URL()
		}, wire.KindTimeout, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr, err := NewTransport(tc.proxy(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			url := srv.URL
			if tc.tls {
				url = tlsSrv.URL
				tr.TLSClientConfig = tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("RoundTrip = %s, want an error", resp.Status)
			}
			if got := ClassifyError(err); got != tc.want {
				t.Errorf("ClassifyError(%v) = %q, want %q", err, got, tc.want)
			}
		})
	}
}

// TestRouteTransportTargetStatus checks that a target's own error status,
// forwarded by an HTTP proxy, stays a response: only the proxy's refusal
// is a ProxyError.
func TestRouteTransportTargetStatus(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	p := proxytest.Start(t, proxytest.HTTPConnect)
	tr, err := NewTransport(p.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip = %v, want the target's 403", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("StatusCode = %d, want %d", resp.StatusCode, http.StatusForbidden)
	}
	if got := p.TunnelsTo(srv.Listener.Addr().String()); got != 1 {
		t.Errorf("requests forwarded to the target = %d, want 1", got)
	}
}

func TestNewTransportRejects(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"https://h:1", "socks5://h", "ftp://u:hunter2@h:1"} {
		_, err := NewTransport(p, nil)
		if err == nil {
			t.Errorf("NewTransport(%q) = nil error, want one", p)
			continue
		}
		if got := err.Error(); got == "" || strings.Contains(got, "hunter2") {
			t.Errorf("NewTransport(%q) error = %q, want a message without the password", p, got)
		}
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	s, err := NewStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(nope) = %v, want ErrNotFound", err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 0 {
		t.Errorf("List(empty) = %v, %v; want none", list, err)
	}
	for _, id := range []string{"b", "a"} {
		if _, err := s.Put(ctx, wire.Route{ID: id, State: wire.RouteAvailable, Score: 90, Proxy: "direct"}); err != nil {
			t.Fatal(err)
		}
	}
	r, rev, err := s.Get(ctx, "a")
	if err != nil || r.Score != 90 || rev == 0 {
		t.Errorf("Get(a) = %+v, %d, %v; want score 90 at a revision", r, rev, err)
	}
	list, err = s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" {
		t.Errorf("List = %+v, want a then b", list)
	}
}

// pickerEnv is a broker, a route store, a picker and a fake clock.
type pickerEnv struct {
	env   *brokertest.Env
	store *Store
	pick  *Picker
	clock *clock.Fake
}

func newPickerEnv(t *testing.T) *pickerEnv {
	t.Helper()
	env := brokertest.Start(t)
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	store, err := NewStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPicker(ctx, PickerConfig{Clock: clk, Wait: 45 * time.Second}, env.NC, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &pickerEnv{env: env, store: store, pick: p, clock: clk}
}

func (pe *pickerEnv) put(t *testing.T, r wire.Route) {
	t.Helper()
	if _, err := pe.store.Put(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

// waitAuto polls until the picker's view picks want for "auto".
func (pe *pickerEnv) waitAuto(t *testing.T, want string) {
	t.Helper()
	check.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		r, err := pe.pick.Pick(context.Background(), wire.RouteAuto)
		if err != nil || r.ID != want {
			return fmt.Errorf("Pick(auto) = %q, %v; want %q", r.ID, err, want)
		}
		return nil
	})
}

func TestPickAutoAvoidsCooldown(t *testing.T) {
	t.Parallel()
	pe := newPickerEnv(t)
	srv := target(t)
	healthy := proxytest.Start(t, proxytest.HTTPConnect)
	cooling := proxytest.Start(t, proxytest.SOCKS5)
	until := pe.clock.Now().Add(2 * time.Minute)
	pe.put(t, wire.Route{ID: "healthy", State: wire.RouteAvailable, Score: 70, Proxy: healthy.URL()})
	pe.put(t, wire.Route{ID: "cooling", State: wire.RouteCooldown, Score: 99, Proxy: cooling.URL(), CooldownUntil: &until})
	pe.put(t, wire.Route{ID: "off", State: wire.RouteDisabled, Score: 100, Proxy: cooling.URL()})
	pe.waitAuto(t, "healthy")

	ctx := context.Background()
	for range 5 {
		rt, id, err := pe.pick.Transport(ctx, wire.RouteAuto)
		if err != nil {
			t.Fatal(err)
		}
		if id != "healthy" {
			t.Fatalf("picked %q, want healthy", id)
		}
		if _, err := get(t, rt, srv.URL); err != nil {
			t.Fatal(err)
		}
	}
	if got := healthy.Tunnels(); got < 1 {
		t.Errorf("healthy proxy Tunnels = %d, want at least 1", got)
	}
	if got := cooling.Tunnels(); got != 0 {
		t.Errorf("cooling proxy Tunnels = %d, want 0", got)
	}

	_, _, err := pe.pick.Transport(ctx, "cooling")
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("Transport(cooling) = %v, want a UnavailableError", err)
	}
	if got, want := ue.RetryAfter(), 2*time.Minute; got != want {
		t.Errorf("RetryAfter = %v, want %v", got, want)
	}
	pe.clock.Advance(90 * time.Second)
	_, err = pe.pick.Pick(ctx, "cooling")
	if !errors.As(err, &ue) || ue.RetryAfter() != 30*time.Second {
		t.Errorf("Pick(cooling) after 90s = %v, want a retry in 30s", err)
	}
	if _, err := pe.pick.Pick(ctx, "off"); !errors.As(err, &ue) || ue.RetryAfter() != 45*time.Second {
		t.Errorf("Pick(off) = %v, want a retry in the configured 45s", err)
	}
	_, err = pe.pick.Pick(ctx, "nope")
	var perm interface{ Permanent() bool }
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &perm) || !perm.Permanent() {
		t.Errorf("Pick(nope) = %v, want a permanent ErrNotFound", err)
	}

	pe.put(t, wire.Route{ID: "healthy", State: wire.RouteCooldown, Score: 20, Proxy: healthy.URL(), CooldownUntil: &until})
	// The picker's view follows the bucket within moments.
	check.For(t, 5*time.Second, 5*time.Millisecond, func() error {
		var r wire.Route
		if r, err = pe.pick.Pick(ctx, wire.RouteAuto); err == nil {
			return fmt.Errorf("Pick(auto) = %q, nil; want an error once every route is down", r.ID)
		}
		return nil
	})
	if !errors.As(err, &ue) || ue.RetryAfter() != 30*time.Second {
		t.Errorf("Pick(auto) with every route down = %v, want a retry when the first cooldown ends (30s)", err)
	}
}

func TestPickAutoBestScore(t *testing.T) {
	t.Parallel()
	pe := newPickerEnv(t)
	ctx := context.Background()
	if _, err := pe.pick.Pick(ctx, wire.RouteAuto); !errors.Is(err, ErrNoRoutes) {
		t.Errorf("Pick(auto) on an empty bucket = %v, want ErrNoRoutes", err)
	}
	pe.put(t, wire.Route{ID: "a", State: wire.RouteAvailable, Score: 80, LatencyMS: 50})
	pe.put(t, wire.Route{ID: "b", State: wire.RouteAvailable, Score: 95, LatencyMS: 90})
	pe.put(t, wire.Route{ID: "c", State: wire.RouteAvailable, Score: 95, LatencyMS: 40})
	pe.waitAuto(t, "c") // best score, then lowest latency
	pe.put(t, wire.Route{ID: "b", State: wire.RouteAvailable, Score: 95, LatencyMS: 40})
	pe.waitAuto(t, "b") // same score and latency: lowest id
	pe.put(t, wire.Route{ID: "a", State: wire.RouteAvailable, Score: 99, LatencyMS: 500})
	pe.waitAuto(t, "a")
	rt, id, err := pe.pick.Transport(ctx, "a")
	if err != nil || id != "a" || rt == nil {
		t.Errorf("Transport(a) = %v, %q, %v; want a direct transport for a", rt, id, err)
	}
}

func TestReport(t *testing.T) {
	t.Parallel()
	pe := newPickerEnv(t)
	sub, err := pe.env.NC.SubscribeSync(wire.SubjectRouteReportAll)
	if err != nil {
		t.Fatal(err)
	}
	if err := pe.env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport("http://"+proxytest.ClosedAddr(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, gerr := get(t, tr, "http://127.0.0.1:1/")
	ctx := context.Background()
	pe.pick.Report(ctx, "office", context.Canceled)
	pe.pick.Report(ctx, "office", nil)
	pe.pick.Report(ctx, "office", gerr)
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := msg.Subject, "gantry.health.report.office"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
	var rep wire.RouteReport
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Route != "office" || rep.Kind != wire.KindRefused || rep.Error == "" {
		t.Errorf("report = %+v, want route office, kind refused, an error", rep)
	}
	if _, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("a second report arrived, want nil and cancelled errors not reported")
	}
}

// TestUnavailableErrorRounds: the wait reads "retry in 4m0s", not
// "retry in 3m59.953555092s".
func TestUnavailableErrorRounds(t *testing.T) {
	t.Parallel()
	err := &UnavailableError{Route: "office", State: wire.RouteCooldown, Wait: 3*time.Minute + 59953555092*time.Nanosecond}
	if got, want := err.Error(), `route "office" is COOLDOWN; retry in 4m0s`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
