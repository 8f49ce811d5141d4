package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

// finished collects the TASK_FINISHED events of a running gantry.
type finished struct {
	ch chan wire.Event
}

func watchFinished(t *testing.T, nc *nats.Conn) *finished {
	t.Helper()
	f := &finished{ch: make(chan wire.Event, 64)}
	sub, err := nc.Subscribe(wire.EventTaskFinished.Subject(), func(m *nats.Msg) {
		var ev wire.Event
		if json.Unmarshal(m.Data, &ev) == nil {
			f.ch <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// wait returns the TASK_FINISHED event of task id.
func (f *finished) wait(t *testing.T, id string) wire.Event {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-f.ch:
			if ev.TaskID == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("task %s did not finish within 20s", id)
		}
	}
}

// publishHTTP publishes an http task with route and returns its id.
func publishHTTP(t *testing.T, nc *nats.Conn, id, url, route string) {
	t.Helper()
	payload, _ := json.Marshal(wire.HTTPPayload{URL: url, Route: route})
	body, _ := json.Marshal(wire.Task{ID: id, Payload: payload, MaxAttempts: 1})
	_, js := brokertest.Connect(t, nc.ConnectedUrl())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, wire.TaskSubject("", "http"), body); err != nil {
		t.Fatal(err)
	}
}

func state(t *testing.T, ev wire.Event) string {
	t.Helper()
	var p struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(ev.Payload, &p)
	return p.State
}

// TestHTTPTaskRouteAuto is the done-when: an http task with route
// auto goes out through the healthy proxy and never through the one in
// COOLDOWN, as counted at the proxies; a request that fails because of its
// route shows in the route's health.
func TestHTTPTaskRouteAuto(t *testing.T) {
	t.Parallel()
	probeSite := okSite(t)
	var hits atomic.Int64
	taskSite := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte("done"))
	}))
	t.Cleanup(taskSite.Close)
	exit := proxytest.ExitServer(t, "eu")
	healthy := proxytest.Start(t, proxytest.HTTPConnect)
	wrong := proxytest.Start(t, proxytest.SOCKS5)
	dying := proxytest.Start(t, proxytest.HTTPConnect)
	cfg := writeConfig(t, fmt.Sprintf(`routes:
  - {id: healthy, proxy: %q, probe_url: %q, interval: 1h}
  - {id: wrong, proxy: %q, probe_url: %q, interval: 1h, expect_ip: 198.51.100.7, expect_url: %q}
  - {id: dying, proxy: %q, probe_url: %q, interval: 1h}
`, healthy.URL(), probeSite.URL, wrong.URL(), probeSite.URL, exit.URL, dying.URL(), probeSite.URL))
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg)
	url := ready.NATS
	waitChecked(t, url, 3)

	// wrong's exit IP is not the expected one: probed until its score
	// (100 − 15 per failure) falls below 50, it is in COOLDOWN.
	for range 3 {
		if code, _, stderr := runInProcess(t, "route", "probe", "wrong", "--apply", "--server", url); code != exitFailure || !strings.Contains(stderr, "wrong_exit") {
			t.Fatalf("route probe wrong = exit %d, stderr %q; want exit 1, wrong_exit", code, stderr)
		}
	}
	routes := waitChecked(t, url, 3)
	if routes["wrong"]["state"] != "COOLDOWN" || routes["healthy"]["state"] != "AVAILABLE" || routes["dying"]["state"] != "AVAILABLE" {
		t.Fatalf("states = wrong %v, healthy %v, dying %v; want COOLDOWN, AVAILABLE, AVAILABLE",
			routes["wrong"]["state"], routes["healthy"]["state"], routes["dying"]["state"])
	}
	// dying must not win auto: make it the worst AVAILABLE route by one
	// failed request, which also shows real traffic reaching its health.
	dying.Close()
	nc, _ := brokertest.Connect(t, url)
	fin := watchFinished(t, nc)
	publishHTTP(t, nc, "through-dying", taskSite.URL, "dying")
	if ev := fin.wait(t, "through-dying"); state(t, ev) == "SUCCEEDED" {
		t.Fatalf("task through a closed proxy = %s, want a failure", state(t, ev))
	}
	poll.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if d := waitChecked(t, url, 3)["dying"]; d["consecutive_failures"].(float64) < 1 || d["last_error_kind"] != "refused" {
			return fmt.Errorf("dying = %v, want the failed request counted (refused)", d)
		}
		return nil
	})

	target := strings.TrimPrefix(taskSite.URL, "http://")
	for i := range 3 {
		id := fmt.Sprintf("auto-%d", i)
		publishHTTP(t, nc, id, taskSite.URL, wire.RouteAuto)
		if ev := fin.wait(t, id); state(t, ev) != "SUCCEEDED" {
			t.Fatalf("task %s = %s (%s), want SUCCEEDED", id, state(t, ev), ev.Message)
		}
	}
	if got := hits.Load(); got != 3 {
		t.Errorf("task site hits = %d, want 3", got)
	}
	if got := healthy.TunnelsTo(target); got < 1 {
		t.Errorf("healthy proxy tunnels to the task site = %d, want >= 1", got)
	}
	if got := wrong.TunnelsTo(target); got != 0 {
		t.Errorf("COOLDOWN proxy tunnels to the task site = %d, want 0", got)
	}
}
