package healthd

import (
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

func TestScore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lat    int64
		cf, rt int
		want   float64
	}{
		{0, 0, 0, 100},
		{200, 0, 0, 90},
		{37, 0, 0, 98.15},
		{100, 2, 1, 55},
		{0, 10, 0, 0},
		{0, 0, 11, 0},
	} {
		if got := Score(tc.lat, tc.cf, tc.rt); got != tc.want {
			t.Errorf("Score(%d, %d, %d) = %v, want %v", tc.lat, tc.cf, tc.rt, got, tc.want)
		}
	}
}

func TestPolicy(t *testing.T) {
	t.Parallel()
	p := policy{threshold: 50, cooldownBase: time.Minute, cooldownMax: 3 * time.Minute, timeoutWindow: 10 * time.Minute, stableAfter: 2}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	r := wire.Route{ID: "r", State: wire.RouteAvailable, Score: 100}
	fail := outcome{kind: wire.KindTimeout, err: "i/o timeout", probe: true}
	// 100 − 15·1 − 10·1 = 75, then 50, then 100 − 45 − 30 = 25: cooldown.
	for i, want := range []float64{75, 50, 25} {
		tr := p.apply(&r, fail, now)
		if r.Score != want {
			t.Errorf("after failure %d: Score = %v, want %v", i+1, r.Score, want)
		}
		if wantTr := map[bool]transition{true: cooledDown, false: stay}[want < 50]; tr != wantTr {
			t.Errorf("after failure %d: transition = %v, want %v", i+1, tr, wantTr)
		}
	}
	if r.State != wire.RouteCooldown || !r.CooldownUntil.Equal(now.Add(time.Minute)) {
		t.Fatalf("State = %s until %v, want COOLDOWN until +1m", r.State, r.CooldownUntil)
	}
	if r.RecentTimeouts != 3 || r.LastErrorKind != wire.KindTimeout {
		t.Errorf("RecentTimeouts, LastErrorKind = %d, %q; want 3, timeout", r.RecentTimeouts, r.LastErrorKind)
	}
	// A report during the cooldown counts but does not end it.
	if tr := p.apply(&r, outcome{kind: wire.KindRefused, err: "refused"}, now.Add(time.Second)); tr != stay || r.State != wire.RouteCooldown {
		t.Errorf("report in cooldown: transition %v, state %s; want stay in COOLDOWN", tr, r.State)
	}
	// Failed re-probes lengthen the cooldown: 2m, then capped at 3m.
	for i, want := range []time.Duration{2 * time.Minute, 3 * time.Minute, 3 * time.Minute} {
		now = now.Add(time.Hour)
		if tr := p.apply(&r, fail, now); tr != cooledDown {
			t.Errorf("re-probe %d: transition = %v, want cooledDown", i+1, tr)
		}
		if got := r.CooldownUntil.Sub(now); got != want {
			t.Errorf("re-probe %d: cooldown = %v, want %v", i+1, got, want)
		}
	}
	// Old timeouts have aged out of the window; a success recovers.
	now = now.Add(time.Hour)
	ok := outcome{ok: true, probe: true, measured: true, latencyMS: 100}
	if tr := p.apply(&r, ok, now); tr != recovered || r.State != wire.RouteAvailable || r.CooldownUntil != nil {
		t.Fatalf("successful re-probe: transition %v, state %s, until %v; want recovered, AVAILABLE, nil", tr, r.State, r.CooldownUntil)
	}
	if r.Score != 95 || r.RecentTimeouts != 0 || r.ConsecutiveFailures != 0 {
		t.Errorf("after recovery: score %v, recent timeouts %d, failures %d; want 95, 0, 0", r.Score, r.RecentTimeouts, r.ConsecutiveFailures)
	}
	if r.CooldownStreak != 4 {
		t.Errorf("CooldownStreak right after recovery = %d, want 4 (kept until the route settles)", r.CooldownStreak)
	}
	p.apply(&r, ok, now.Add(time.Minute))
	if r.CooldownStreak != 0 {
		t.Errorf("CooldownStreak after %d successes = %d, want 0", p.stableAfter, r.CooldownStreak)
	}
	if r.LastChecked == nil || !r.LastChecked.Equal(now.Add(time.Minute)) {
		t.Errorf("LastChecked = %v, want the last probe's time", r.LastChecked)
	}
}

func TestRecentTimeoutsBounded(t *testing.T) {
	t.Parallel()
	p := policy{threshold: 50, cooldownBase: time.Minute, cooldownMax: time.Hour, timeoutWindow: time.Hour, stableAfter: 3}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	r := wire.Route{ID: "r", State: wire.RouteAvailable}
	for i := range 500 {
		p.apply(&r, outcome{kind: wire.KindTimeout, err: "timeout"}, now.Add(time.Duration(i)*time.Second))
	}
	if r.RecentTimeouts != maxRecentTimeouts || len(r.TimeoutTimes) != maxRecentTimeouts || r.Score != 0 {
		t.Errorf("after 500 timeouts: RecentTimeouts %d, stored %d, score %v; want %d, %d, 0",
			r.RecentTimeouts, len(r.TimeoutTimes), r.Score, maxRecentTimeouts, maxRecentTimeouts)
	}
	if last := r.TimeoutTimes[len(r.TimeoutTimes)-1]; !last.Equal(now.Add(499 * time.Second)) {
		t.Errorf("latest timeout kept = %v, want the last one", last)
	}
}

func TestParseExit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body, ip, region string
	}{
		{`{"ip":"1.2.3.4","region":"eu"}`, "1.2.3.4", "eu"},
		{`{"origin":"5.6.7.8, 10.0.0.1"}`, "5.6.7.8", ""},
		{`{"query":"9.9.9.9","countryCode":"DE","regionName":"Berlin"}`, "9.9.9.9", "DE"},
		{"203.0.113.9\n", "203.0.113.9", ""},
		{"<html>", "", ""},
	} {
		ip, regions := parseExit([]byte(tc.body))
		region := ""
		if len(regions) > 0 {
			region = regions[0]
		}
		if ip != tc.ip || region != tc.region {
			t.Errorf("parseExit(%s) = %q, %q; want %q, %q", tc.body, ip, region, tc.ip, tc.region)
		}
	}
}
