package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

// okSite is a real HTTP server on loopback answering 200.
func okSite(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// writeConfig writes a config file for the test and returns its path.
func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gantry.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// routeLs runs `gantry route ls --json` against url.
func routeLs(t *testing.T, url string) []map[string]any {
	t.Helper()
	code, stdout, stderr := runInProcess(t, "route", "ls", "--json", "--server", url)
	if code != exitOK {
		t.Fatalf("route ls --json = exit %d, stderr %q", code, stderr)
	}
	var out []map[string]any
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("route ls --json printed %q: %v", stdout, err)
	}
	return out
}

// waitChecked polls `gantry route ls` until n routes have been checked.
func waitChecked(t *testing.T, url string, n int) map[string]map[string]any {
	t.Helper()
	var byID map[string]map[string]any
	poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		byID = map[string]map[string]any{}
		checked := 0
		for _, r := range routeLs(t, url) {
			byID[r["id"].(string)] = r
			if r["last_checked"] != nil {
				checked++
			}
		}
		if checked < n {
			return fmt.Errorf("routes checked = %d, want %d: %v", checked, n, byID)
		}
		return nil
	})
	return byID
}

func TestHealthdAndRouteCommands(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	site := okSite(t)
	proxy := proxytest.Start(t, proxytest.HTTPConnect, proxytest.WithAuth("bob", "hunter2"))
	cfg := writeConfig(t, fmt.Sprintf(`routes:
  - {id: good, proxy: %q, probe_url: %q, interval: 1h}
  - {id: bad, proxy: "socks5://%s", probe_url: %q, interval: 1h}
`, proxy.URL(), site.URL, proxytest.ClosedAddr(t), site.URL))
	startGantry(t, "healthd", "--server", env.URL, "--config", cfg)

	routes := waitChecked(t, env.URL, 2)
	for _, key := range []string{"id", "state", "score", "latency_ms", "consecutive_successes", "consecutive_failures", "last_error", "cooldown_until", "last_checked"} {
		for id, r := range routes {
			if _, ok := r[key]; !ok {
				t.Errorf("route ls --json: route %s has no %q", id, key)
			}
		}
	}
	if g := routes["good"]; g["state"] != "AVAILABLE" || g["score"].(float64) < 90 || g["consecutive_successes"].(float64) != 1 {
		t.Errorf("good = %v, want AVAILABLE, score >= 90, 1 success", g)
	}
	if b := routes["bad"]; b["consecutive_failures"].(float64) != 1 || b["last_error_kind"] != "refused" || b["score"].(float64) != 85 {
		t.Errorf("bad = %v, want 1 failure, kind refused, score 85", b)
	}

	code, stdout, _ := runInProcess(t, "route", "ls", "--server", env.URL)
	if code != exitOK || !strings.Contains(stdout, "good") || !strings.Contains(stdout, "AVAILABLE") || !strings.Contains(stdout, "SCORE") {
		t.Errorf("route ls = exit %d, %q; want a table with good AVAILABLE", code, stdout)
	}
	if strings.Contains(stdout, "hunter2") {
		t.Errorf("route ls printed the proxy password: %q", stdout)
	}

	code, stdout, stderr := runInProcess(t, "route", "probe", "good", "--apply", "--json", "--server", env.URL)
	var reply struct {
		Result struct {
			OK bool `json:"ok"`
		} `json:"result"`
		Route struct {
			ConsecutiveSuccesses int    `json:"consecutive_successes"`
			Proxy                string `json:"proxy"`
		} `json:"route"`
	}
	if err := json.Unmarshal([]byte(stdout), &reply); err != nil || code != exitOK {
		t.Fatalf("route probe good = exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if !reply.Result.OK || reply.Route.ConsecutiveSuccesses != 2 || strings.Contains(reply.Route.Proxy, "hunter2") {
		t.Errorf("route probe good = %+v, want ok, 2 successes, password redacted", reply)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"route", "probe", "bad"}, exitFailure, "failed at stage tcp (refused)"},
		{[]string{"route", "probe", "nope"}, exitNotFound, `route "nope" is not among`},
		{[]string{"route", "probe", "a.b"}, exitUsage, "route id"},
		{[]string{"route", "probe"}, exitUsage, "want a route id"},
	} {
		code, _, stderr := runInProcess(t, append(tc.args, "--server", env.URL)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("gantry %v = exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}

func TestRouteWithoutHealthd(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	code, _, stderr := runInProcess(t, "route", "probe", "office", "--server", env.URL)
	if code != exitFailure || !strings.Contains(stderr, "no healthd answered") {
		t.Errorf("route probe without healthd = exit %d, stderr %q; want exit 1 saying no healthd answered", code, stderr)
	}
	if got := routeLs(t, env.URL); len(got) != 0 {
		t.Errorf("route ls on an empty bucket = %v, want []", got)
	}
}

func TestHealthdBadConfig(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	sub, err := env.NC.SubscribeSync(wire.EventConfigRejected.Subject())
	if err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, "routes:\n  - {id: a, proxy: 'ftp://u:hunter2@h:1', probe_url: 'http://x/'}\n")
	code, _, stderr := runInProcess(t, "healthd", "--config", cfg, "--server", env.URL)
	if code != exitUsage || !strings.Contains(stderr, "want an http:// or socks5:// URL") || strings.Contains(stderr, "hunter2") {
		t.Errorf("healthd with a bad route = exit %d, stderr %q; want exit 2 naming the problem, password redacted", code, stderr)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no CONFIG_REJECTED event: %v", err)
	}
	var ev wire.Event
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Component != "healthd" || !strings.Contains(ev.Message, "routes[0]") || strings.Contains(string(msg.Data), "hunter2") {
		t.Errorf("CONFIG_REJECTED = %s, want healthd's, naming routes[0], password redacted", msg.Data)
	}
	code, _, stderr = runInProcess(t, "healthd", "--config", cfg, "--server", "nats://127.0.0.1:1")
	if code != exitUsage || !strings.Contains(stderr, "want an http:// or socks5:// URL") {
		t.Errorf("healthd with a bad route and no broker = exit %d, stderr %q; want exit 2 naming the problem", code, stderr)
	}
}

func TestRunProbesRoutes(t *testing.T) {
	t.Parallel()
	site := okSite(t)
	proxy := proxytest.Start(t, proxytest.SOCKS5)
	cfg := writeConfig(t, fmt.Sprintf("routes:\n  - {id: office, proxy: %q, probe_url: %q, interval: 1h}\n", proxy.URL(), site.URL))
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg)
	waitChecked(t, ready.NATS, 1)
	code, stdout, stderr := runInProcess(t, "route", "probe", "office", "--server", ready.NATS)
	if code != exitOK || !strings.Contains(stdout, "ok") || !strings.Contains(stdout, "office") {
		t.Errorf("route probe office = exit %d, stdout %q, stderr %q; want exit 0 and the result", code, stdout, stderr)
	}
	if got := proxy.Tunnels(); got < 2 {
		t.Errorf("proxy tunnels = %d, want >= 2 (the first probe and the one asked for)", got)
	}
}
