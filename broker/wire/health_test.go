package wire

import (
	"testing"
	"time"
)

func TestHealthGolden(t *testing.T) {
	t.Parallel()
	until := t0.Add(time.Minute)
	cases := map[string]any{
		"route_health": Route{
			ID: "plant-proxy", State: RouteCooldown, Score: 27.5, LatencyMS: 250, ConsecutiveFailures: 4,
			LastError: "dial tcp 10.0.0.7:1080: i/o timeout", CooldownUntil: &until, LastChecked: &t0,
			Proxy: "socks5://10.0.0.7:1080", RecentTimeouts: 1, TimeoutTimes: []time.Time{t0},
			LastErrorKind: KindTimeout, CooldownStreak: 2,
		},
		"health_result": HealthResult{
			Route: "plant-proxy", Time: t0, Stage: StageExit, Kind: KindWrongExit,
			Error: "exit ip 10.1.1.1, want 10.0.0.7", LatencyMS: 31, ExitIP: "10.1.1.1", Region: "eu",
			State: RouteAvailable, Score: 83.45,
		},
		"route_report": RouteReport{Route: "plant-proxy", Time: t0, Kind: KindRefused, Error: "connection refused", TaskID: "task-1"},
		"route_probe_reply": RouteProbeReply{
			Result: &HealthResult{Route: "office", Time: t0, OK: true, LatencyMS: 12, State: RouteAvailable, Score: 99.4},
			Route:  &Route{ID: "office", State: RouteAvailable, Score: 99.4, LatencyMS: 12, ConsecutiveSuccesses: 3, LastChecked: &t0, Proxy: "direct"},
		},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, v)
		})
	}
}

func TestRouteSubjects(t *testing.T) {
	t.Parallel()
	if got, want := RouteReportSubject("office"), "gantry.health.report.office"; got != want {
		t.Errorf("RouteReportSubject = %q, want %q", got, want)
	}
	if got, want := HealthSubject("office"), "gantry.health.route.office"; got != want {
		t.Errorf("HealthSubject = %q, want %q", got, want)
	}
}

func TestRedactProxy(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                 "",
		"direct":                           "direct",
		"http://10.0.0.1:3128":             "http://10.0.0.1:3128",
		"http://bob:hunter2@10.0.0.1:3128": "http://bob:xxxxx@10.0.0.1:3128",
		"socks5://u:p@h:1080":              "socks5://u:xxxxx@h:1080",
		"http://%zz":                       Redacted,
	} {
		if got := RedactProxy(in); got != want {
			t.Errorf("RedactProxy(%q) = %q, want %q", in, got, want)
		}
	}
}
