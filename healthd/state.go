package healthd

import (
	"math"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Score is a route's score: 100 − latency_ms/20 − 15·consecutive_failures −
// 10·recent_timeouts, clamped to [0, 100] and rounded to two decimals.
func Score(latencyMS int64, consecutiveFailures, recentTimeouts int) float64 {
	s := 100 - float64(latencyMS)/20 - 15*float64(consecutiveFailures) - 10*float64(recentTimeouts)
	s = math.Max(0, math.Min(100, s))
	return math.Round(s*100) / 100
}

// outcome is one observation of a route: a probe result or a report of
// real traffic.
type outcome struct {
	ok        bool
	kind      wire.ErrorKind
	err       string
	latencyMS int64
	// measured says latencyMS holds a measurement (a probe that got an
	// answer).
	measured bool
	// probe marks a probe (which may end a cooldown) as opposed to a
	// report of real traffic.
	probe bool
}

// transition is what an outcome did to a route's state.
type transition int

const (
	stay transition = iota
	cooledDown
	recovered
)

// policy holds the knobs of apply.
type policy struct {
	threshold     float64
	cooldownBase  time.Duration
	cooldownMax   time.Duration
	timeoutWindow time.Duration
	stableAfter   int
}

// apply records o on r at now and moves r between AVAILABLE and COOLDOWN.
func (p policy) apply(r *wire.Route, o outcome, now time.Time) transition {
	if o.probe {
		r.LastChecked = &now
	}
	if o.measured {
		r.LatencyMS = o.latencyMS
	}
	if o.ok {
		r.ConsecutiveSuccesses++
		r.ConsecutiveFailures = 0
	} else {
		r.ConsecutiveFailures++
		r.ConsecutiveSuccesses = 0
		r.LastError, r.LastErrorKind = o.err, o.kind
		if o.kind == wire.KindTimeout {
			r.TimeoutTimes = append(r.TimeoutTimes, now)
		}
	}
	r.TimeoutTimes = recent(r.TimeoutTimes, now.Add(-p.timeoutWindow))
	r.RecentTimeouts = len(r.TimeoutTimes)
	r.Score = Score(r.LatencyMS, r.ConsecutiveFailures, r.RecentTimeouts)

	switch r.State {
	case wire.RouteAvailable:
		if r.ConsecutiveSuccesses >= p.stableAfter {
			r.CooldownStreak = 0
		}
		if r.Score < p.threshold {
			p.cooldown(r, now)
			return cooledDown
		}
	case wire.RouteCooldown:
		if !o.probe {
			return stay
		}
		if o.ok && r.Score >= p.threshold {
			r.State = wire.RouteAvailable
			r.CooldownUntil = nil
			return recovered
		}
		p.cooldown(r, now)
		return cooledDown
	}
	return stay
}

// cooldown puts r in COOLDOWN from now: base·2^(streak−1), at most max.
func (p policy) cooldown(r *wire.Route, now time.Time) {
	r.CooldownStreak++
	d := p.cooldownBase
	for i := 1; i < r.CooldownStreak && d < p.cooldownMax; i++ {
		d *= 2
	}
	until := now.Add(min(d, p.cooldownMax))
	r.State = wire.RouteCooldown
	r.CooldownUntil = &until
}

// maxRecentTimeouts bounds the timeouts a route remembers: ten already
// bring its score to 0, and a burst of failed traffic must not grow the
// stored route without bound.
const maxRecentTimeouts = 20

// recent drops the times before since, and all but the latest
// maxRecentTimeouts.
func recent(ts []time.Time, since time.Time) []time.Time {
	out := ts[:0]
	for _, t := range ts {
		if !t.Before(since) {
			out = append(out, t)
		}
	}
	if len(out) > maxRecentTimeouts {
		out = out[len(out)-maxRecentTimeouts:]
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
