package alertd

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/config"
)

// check checks the state rules once, and sends the held alerts whose
// window has passed. A state that cannot be read skips its rules this
// time.
func (a *Alertd) check(ctx context.Context) {
	now := a.clock.Now()
	if a.has(config.AlertLongRunning) {
		if workers, err := a.client.Workers(ctx); err == nil {
			a.longRunning(workers, now)
		} else {
			a.log.Debug("read workers", "err", err)
		}
	}
	if a.has(config.AlertRouteDown) {
		if routes, err := a.client.Routes(ctx); err == nil {
			for _, r := range a.rules(config.AlertRouteDown) {
				for _, rt := range routes {
					down := rt.State != wire.RouteAvailable && rt.State != wire.RouteDisabled
					details, _ := json.Marshal(map[string]any{"state": rt.State, "score": rt.Score, "last_error": rt.LastError})
					a.episode(r, rt.ID, down, r.After.Std(), now, wire.Alert{
						Summary: fmt.Sprintf("route %s is %s (score %.0f)", rt.ID, rt.State, rt.Score), Details: details})
				}
			}
		} else {
			a.log.Debug("read routes", "err", err)
		}
	}
	if a.has(config.AlertResourceFault) {
		if resources, err := a.client.Resources(ctx); err == nil {
			for _, r := range a.rules(config.AlertResourceFault) {
				for _, res := range resources {
					details, _ := json.Marshal(map[string]any{"last_error": res.LastError})
					a.episode(r, res.ID, res.State == wire.ResourceFault, r.After.Std(), now, wire.Alert{
						Summary: fmt.Sprintf("resource %s is in FAULT: %s", res.ID, cmp.Or(res.LastError, "no error recorded")), Details: details})
				}
			}
		} else {
			a.log.Debug("read resources", "err", err)
		}
	}
	if a.has(config.AlertLeaderLost) {
		if leading, err := a.client.SchedulerLeading(ctx); err == nil {
			for _, r := range a.rules(config.AlertLeaderLost) {
				a.episode(r, "scheduler", !leading, cmp.Or(r.After.Std(), DefaultLeaderAfter), now, wire.Alert{
					Summary: "no scheduler leads: jobs do not fire"})
			}
		} else {
			a.log.Debug("read scheduler leader", "err", err)
		}
	}
	if a.has(config.AlertAuditLag) {
		if lag, err := a.client.AuditLag(ctx); err == nil {
			for _, r := range a.rules(config.AlertAuditLag) {
				behind := r.MaxPending > 0 && lag.Pending > uint64(r.MaxPending) ||
					r.MaxLag > 0 && lag.LagSeconds > r.MaxLag.Std().Seconds()
				details, _ := json.Marshal(lag)
				a.episode(r, "auditd", behind, 0, now, wire.Alert{
					Summary: fmt.Sprintf("auditd lags: %d events to store, the oldest %.0fs old", lag.Pending, lag.LagSeconds), Details: details})
			}
		} else {
			a.log.Debug("read audit lag", "err", err)
		}
	}
	a.flush(now)
}

// longRunning raises an alert for each task attempt that has run longer
// than a long_running rule allows, once per attempt.
func (a *Alertd) longRunning(workers []wire.WorkerInfo, now time.Time) {
	live := map[limitKey]bool{}
	for _, r := range a.rules(config.AlertLongRunning) {
		for _, w := range workers {
			for _, t := range w.Tasks {
				if len(r.Types) > 0 && !slices.Contains(r.Types, t.Type) {
					continue
				}
				ran := now.Sub(t.StartedAt)
				if ran < r.After.Std() {
					continue
				}
				key := limitKey{r.Name, fmt.Sprintf("%s#%d", t.ID, t.Attempt)}
				live[key] = true
				a.mu.Lock()
				seen := a.seen[key]
				a.seen[key] = true
				a.mu.Unlock()
				if seen {
					continue
				}
				details, _ := json.Marshal(map[string]any{"worker": w.Name, "host": w.Host, "attempt": t.Attempt,
					"started_at": t.StartedAt, "running_seconds": int(ran.Seconds())})
				a.raise(r, wire.Alert{Rule: r.Name, Kind: r.Kind, Subject: t.Type, Since: t.StartedAt, TaskID: t.ID, Queue: t.Queue, Type: t.Type,
					Summary: fmt.Sprintf("%s task %s has run %s (more than %s) on %s", t.Type, t.ID, ran.Round(time.Second), r.After.Std(), w.Name),
					Details: details}, now)
			}
		}
	}
	a.mu.Lock()
	for key := range a.seen {
		if !live[key] {
			delete(a.seen, key)
		}
	}
	a.mu.Unlock()
}

// episode raises al once when a condition about subject has held for
// after, and again only after it has ended and held again.
func (a *Alertd) episode(r config.AlertRule, subject string, holds bool, after time.Duration, now time.Time, al wire.Alert) {
	key := limitKey{r.Name, subject}
	a.mu.Lock()
	since, known := a.episodes[key]
	switch {
	case !holds:
		delete(a.episodes, key)
		a.mu.Unlock()
		return
	case !known:
		a.episodes[key] = now
		since = now
	case since.IsZero():
		// Alerted already.
		a.mu.Unlock()
		return
	}
	if now.Sub(since) < after {
		a.mu.Unlock()
		return
	}
	a.episodes[key] = time.Time{}
	a.mu.Unlock()
	al.Rule, al.Kind, al.Subject, al.Since = r.Name, r.Kind, subject, since
	a.raise(r, al, now)
}
