package dashboard_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/dashboard"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// bundle is one test's broker, client, dashboard and HTTP server.
type bundle struct {
	c   *client.Client
	nc  *nats.Conn
	d   *dashboard.Dashboard
	srv *httptest.Server
}

// setup serves a dashboard configured by cfg (Listen defaults to
// loopback) over a broker of its own, running until the test ends.
func setup(t *testing.T, cfg dashboard.Config, tlsServer bool) *bundle {
	t.Helper()
	env := brokertest.Start(t)
	nc, _ := brokertest.Connect(t, env.URL)
	c, err := client.New(nc, client.WithComponent("dashboard"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	cfg.Logger = env.Log
	d, err := dashboard.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(d)
	srv.Config.RegisterOnShutdown(d.Stop)
	if tlsServer {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	t.Cleanup(func() {
		srv.Close()
		d.Stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		_ = c.Close()
	})
	select {
	case <-d.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("dashboard not ready within 10s")
	}
	return &bundle{c: c, nc: nc, d: d, srv: srv}
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects, as a browser's requests look to the server.
func (b *bundle) browser(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := b.srv.Client()
	hc.Jar = jar
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return hc
}

type response struct {
	status int
	body   string
	header http.Header
}

func do(t *testing.T, hc *http.Client, method, target string, form url.Values, header map[string]string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, target, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Accept", "text/html")
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{res.StatusCode, string(b), res.Header}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token returns the CSRF token of the forms of page.
func token(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

// actions follows the DASHBOARD_ACTION events from now on.
func actions(t *testing.T, nc *nats.Conn) <-chan wire.DashboardAction {
	t.Helper()
	ch := make(chan wire.DashboardAction, 16)
	sub, err := nc.Subscribe(wire.EventDashboardAction.Subject(), func(m *nats.Msg) {
		var ev wire.Event
		var a wire.DashboardAction
		if json.Unmarshal(m.Data, &ev) == nil && json.Unmarshal(ev.Payload, &a) == nil {
			ch <- a
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

func nextAction(t *testing.T, ch <-chan wire.DashboardAction) wire.DashboardAction {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no DASHBOARD_ACTION event within 10s")
	}
	return wire.DashboardAction{}
}

func addResource(t *testing.T, c *client.Client, id string) {
	t.Helper()
	if _, err := c.AddResource(t.Context(), client.ResourceSpec{ID: id}); err != nil {
		t.Fatal(err)
	}
}

func TestLocalDashboard(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{}, false)
	addResource(t, b.c, "cam1")
	hc := b.browser(t)
	for _, path := range []string{"/", "/tasks", "/resources", "/resources/cam1", "/routes", "/jobs", "/audit", "/static/app.css", "/static/app.js", "/favicon.ico"} {
		if r := do(t, hc, "GET", b.srv.URL+path, nil, nil); r.status != http.StatusOK {
			t.Errorf("GET %s = %d, want 200:\n%s", path, r.status, r.body)
		}
	}
	if r := do(t, hc, "GET", b.srv.URL+"/tasks/nope", nil, nil); r.status != http.StatusNotFound {
		t.Errorf("GET /tasks/nope = %d, want 404", r.status)
	}
	// A name that is not loopback's: a rebound DNS name.
	if r := do(t, hc, "GET", b.srv.URL+"/", nil, map[string]string{"Host": "evil.example:80"}); r.status != http.StatusForbidden {
		t.Errorf("GET / with Host evil.example = %d, want 403", r.status)
	}
}

func TestInsecureListenRefusesEveryRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{Listen: "0.0.0.0:8420"}, false)
	if !b.d.Insecure() {
		t.Error("Insecure = false beyond loopback without users, want true")
	}
	r := do(t, b.browser(t), "GET", b.srv.URL+"/", nil, nil)
	if r.status != http.StatusForbidden || !strings.Contains(r.body, "configure users") {
		t.Errorf("GET / beyond loopback without users = %d, want 403 saying to configure users:\n%s", r.status, r.body)
	}
}

func TestActionNeedsCSRFTokenAndConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{}, false)
	addResource(t, b.c, "cam1")
	events := actions(t, b.nc)
	hc := b.browser(t)
	csrf := token(t, do(t, hc, "GET", b.srv.URL+"/resources", nil, nil).body)
	disable := b.srv.URL + "/resources/cam1/disable"

	if r := do(t, hc, "POST", disable, url.Values{"confirm": {"yes"}}, nil); r.status != http.StatusForbidden {
		t.Errorf("POST without a CSRF token = %d, want 403", r.status)
	}
	wrong := "0" + csrf[1:]
	if wrong == csrf {
		wrong = "1" + csrf[1:]
	}
	if r := do(t, hc, "POST", disable, url.Values{"confirm": {"yes"}, "csrf": {wrong}}, nil); r.status != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF token = %d, want 403", r.status)
	}
	if r := do(t, hc, "POST", disable, url.Values{"confirm": {"yes"}, "csrf": {csrf}}, map[string]string{"Origin": "http://evil.example"}); r.status != http.StatusForbidden {
		t.Errorf("POST from another origin = %d, want 403", r.status)
	}
	// Without the confirmation: a page that asks for it, nothing done.
	r := do(t, hc, "POST", disable, url.Values{"csrf": {csrf}}, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, `name="confirm" value="yes"`) {
		t.Errorf("POST without confirm = %d, want 200 asking to confirm:\n%s", r.status, r.body)
	}
	if res, err := b.c.Resource(t.Context(), "cam1"); err != nil || res.State != wire.ResourceAvailable {
		t.Fatalf("cam1 after unconfirmed disable = %v, %v; want AVAILABLE", res.State, err)
	}
	r = do(t, hc, "POST", disable, url.Values{"csrf": {csrf}, "confirm": {"yes"}}, map[string]string{"Origin": b.srv.URL})
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/resources" {
		t.Errorf("confirmed POST = %d to %q, want 303 to /resources", r.status, r.header.Get("Location"))
	}
	if res, err := b.c.Resource(t.Context(), "cam1"); err != nil || res.State != wire.ResourceDisabled {
		t.Errorf("cam1 after confirmed disable = %v, %v; want DISABLED", res.State, err)
	}
	a := nextAction(t, events)
	if a.User != dashboard.LocalUser || a.Action != dashboard.ActionResourceDisable || a.Outcome != "done" {
		t.Errorf("DASHBOARD_ACTION = %+v, want local's done resource.disable", a)
	}
	if page := do(t, hc, "GET", b.srv.URL+"/resources", nil, nil).body; !strings.Contains(page, "resource cam1 is DISABLED") {
		t.Errorf("page after the action has no flash saying cam1 is DISABLED:\n%s", page)
	}
}

func TestUsersLogInAndRolesAllowActions(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{Users: []dashboard.User{
		{Name: "olga", Password: "op-secret"},
		{Name: "vic", Password: "view-secret", Role: dashboard.RoleViewer},
		{Name: "wendy", Password: "worker-secret", Role: "worker"},
	}}, false)
	addResource(t, b.c, "cam1")
	events := actions(t, b.nc)

	anon := b.browser(t)
	if r := do(t, anon, "GET", b.srv.URL+"/resources", nil, nil); r.status != http.StatusSeeOther || !strings.HasPrefix(r.header.Get("Location"), "/login") {
		t.Errorf("GET /resources without a login = %d to %q, want 303 to /login", r.status, r.header.Get("Location"))
	}
	if r := do(t, anon, "GET", b.srv.URL+"/audit/live", nil, map[string]string{"Accept": "text/event-stream"}); r.status != http.StatusUnauthorized {
		t.Errorf("GET /audit/live without a login = %d, want 401", r.status)
	}
	if r := do(t, anon, "POST", b.srv.URL+"/resources/cam1/disable", url.Values{"confirm": {"yes"}}, nil); r.status == http.StatusSeeOther && !strings.HasPrefix(r.header.Get("Location"), "/login") || r.status == http.StatusOK {
		t.Errorf("POST without a login = %d, want refused", r.status)
	}
	// HTTP basic authentication needs TLS.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", b.srv.URL+"/resources", nil)
	req.SetBasicAuth("olga", "op-secret")
	if res, err := anon.Do(req); err != nil || res.StatusCode == http.StatusOK {
		t.Errorf("basic authentication without TLS = %v, %v; want refused", res.StatusCode, err)
	} else {
		res.Body.Close()
	}

	login := func(user, password string) (*http.Client, response) {
		hc := b.browser(t)
		return hc, do(t, hc, "POST", b.srv.URL+"/login", url.Values{"user": {user}, "password": {password}, "next": {"/resources"}}, nil)
	}
	if _, r := login("olga", "wrong"); r.status != http.StatusUnauthorized {
		t.Errorf("login with a wrong password = %d, want 401", r.status)
	}
	if _, r := login("wendy", "worker-secret"); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "component") {
		t.Errorf("login of a component's role = %d, want 401 saying it is a component's:\n%s", r.status, r.body)
	}

	viewer, r := login("vic", "view-secret")
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/resources" {
		t.Fatalf("viewer login = %d to %q, want 303 to /resources", r.status, r.header.Get("Location"))
	}
	page := do(t, viewer, "GET", b.srv.URL+"/resources", nil, nil).body
	if strings.Contains(page, `data-action="disable"`) {
		t.Error("a viewer's resources page offers Disable, want no action buttons")
	}
	csrf := token(t, page) // the logout form's
	if r := do(t, viewer, "POST", b.srv.URL+"/resources/cam1/disable", url.Values{"csrf": {csrf}, "confirm": {"yes"}}, nil); r.status != http.StatusForbidden {
		t.Errorf("viewer's disable = %d, want 403", r.status)
	}
	if a := nextAction(t, events); a.User != "vic" || a.Role != "viewer" || a.Outcome != "refused" {
		t.Errorf("DASHBOARD_ACTION of the viewer = %+v, want vic's refused", a)
	}

	op, _ := login("olga", "op-secret")
	csrf = token(t, do(t, op, "GET", b.srv.URL+"/resources", nil, nil).body)
	if r := do(t, op, "POST", b.srv.URL+"/resources/cam1/disable", url.Values{"csrf": {csrf}, "confirm": {"yes"}}, nil); r.status != http.StatusSeeOther {
		t.Errorf("operator's disable = %d, want 303", r.status)
	}
	if a := nextAction(t, events); a.User != "olga" || a.Role != "operator" || a.Outcome != "done" {
		t.Errorf("DASHBOARD_ACTION of the operator = %+v, want olga's done", a)
	}
	// Logged out, the session is gone.
	if r := do(t, op, "POST", b.srv.URL+"/logout", url.Values{"csrf": {csrf}}, nil); r.status != http.StatusSeeOther {
		t.Errorf("logout = %d, want 303", r.status)
	}
	if r := do(t, op, "GET", b.srv.URL+"/resources", nil, nil); r.status != http.StatusSeeOther {
		t.Errorf("GET after logout = %d, want 303 to /login", r.status)
	}
}

func TestBasicAuthOverTLS(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{TLS: true, Users: []dashboard.User{{Name: "sam", Password: "s3cret", Role: dashboard.RoleSubmitter}}}, true)
	hc := b.browser(t)
	get := func(user, password string) response {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", b.srv.URL+"/jobs", nil)
		req.SetBasicAuth(user, password)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return response{res.StatusCode, string(body), res.Header}
	}
	if r := get("sam", "wrong"); r.status != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") == "" {
		t.Errorf("wrong basic password over TLS = %d (WWW-Authenticate %q), want 401 asking for it", r.status, r.header.Get("WWW-Authenticate"))
	}
	if r := get("sam", "s3cret"); r.status != http.StatusOK || !strings.Contains(r.body, "submitter") {
		t.Errorf("basic authentication over TLS = %d, want 200 naming the submitter", r.status)
	}
	// The session cookie of a login over TLS is Secure.
	r := do(t, hc, "POST", b.srv.URL+"/login", url.Values{"user": {"sam"}, "password": {"s3cret"}}, nil)
	if c := r.header.Get("Set-Cookie"); !strings.Contains(c, "Secure") || !strings.Contains(c, "HttpOnly") || !strings.Contains(c, "SameSite=Strict") {
		t.Errorf("session cookie over TLS = %q, want Secure, HttpOnly and SameSite=Strict", c)
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		role dashboard.Role
		act  string
		want bool
	}{
		{dashboard.RoleOperator, dashboard.ActionTaskPurge, true},
		{dashboard.RoleSubmitter, dashboard.ActionTaskRetry, false},
		{dashboard.RoleSubmitter, dashboard.ActionJobTrigger, true},
		{dashboard.RoleSubmitter, dashboard.ActionTaskCancel, false},
		{dashboard.RoleSubmitter, dashboard.ActionResourceDisable, false},
		{dashboard.RoleViewer, dashboard.ActionTaskRetry, false},
		{dashboard.RoleViewer, dashboard.ActionRouteProbe, false},
		{"worker", dashboard.ActionTaskRetry, false},
	} {
		if got := tc.role.Allows(tc.act); got != tc.want {
			t.Errorf("Role(%q).Allows(%q) = %v, want %v", tc.role, tc.act, got, tc.want)
		}
	}
}
