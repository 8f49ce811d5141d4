package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/audit"
)

// probeWait bounds a probe asked from the routes page: healthd's probe
// timeout (10 s by default) and some.
const probeWait = 30 * time.Second

// verbs say what each action did, for the audit trail and the page.
var verbs = map[string]string{
	ActionTaskRetry:       "retried task",
	ActionTaskCancel:      "cancelled task",
	ActionTaskPurge:       "purged task",
	ActionResourceEnable:  "enabled resource",
	ActionResourceDisable: "disabled resource",
	ActionRouteProbe:      "probed route",
	ActionJobTrigger:      "triggered job",
	ActionJobPause:        "paused job",
	ActionJobResume:       "resumed job",
}

// deed is one action asked from a page.
type deed struct {
	action string
	// target names what it acts on; ev carries its id field.
	target string
	ev     wire.Event
	// back is the page to return to.
	back string
	do   doer
}

// doer does an action for the user p and says what it did.
type doer func(ctx context.Context, p *principal) (string, error)

func (d *Dashboard) taskAction(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dd := deed{action: "task." + r.PathValue("action"), target: id, ev: wire.Event{TaskID: id}, back: "/tasks/" + url.PathEscape(id)}
	if dd.action == ActionTaskPurge {
		dd.back = "/tasks"
	}
	d.actOneOf(w, r, dd, "task", map[string]doer{
		ActionTaskRetry: func(ctx context.Context, _ *principal) (string, error) {
			rec, err := d.c.RetryTask(ctx, id)
			return fmt.Sprintf("task %s runs again (run %d)", id, max(rec.Run, 1)), err
		},
		ActionTaskCancel: func(ctx context.Context, _ *principal) (string, error) {
			res, err := d.c.CancelTask(ctx, id)
			return fmt.Sprintf("task %s cancelled (it was %s)", id, res.Was), err
		},
		ActionTaskPurge: func(ctx context.Context, _ *principal) (string, error) {
			return fmt.Sprintf("the record of task %s is purged; its events stay in the audit trail", id), d.c.PurgeTask(ctx, id)
		},
	})
}

func (d *Dashboard) resourceAction(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dd := deed{action: "resource." + r.PathValue("action"), target: id, ev: wire.Event{ResourceID: id}, back: "/resources"}
	// set enables or disables the resource with the form's reason, or
	// one saying who did it.
	set := func(op func(ctx context.Context, id, reason string) (client.Resource, error), verb string) doer {
		return func(ctx context.Context, p *principal) (string, error) {
			reason := r.PostFormValue("reason")
			if reason == "" {
				reason = verb + " from the dashboard by " + p.User
			}
			res, err := op(ctx, id, reason)
			return fmt.Sprintf("resource %s is %s", id, res.State), err
		}
	}
	d.actOneOf(w, r, dd, "resource", map[string]doer{
		ActionResourceEnable:  set(d.c.EnableResource, "enabled"),
		ActionResourceDisable: set(d.c.DisableResource, "disabled"),
	})
}

func (d *Dashboard) routeProbe(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	d.act(w, r, deed{action: ActionRouteProbe, target: id, ev: wire.Event{RouteID: id}, back: "/routes",
		do: func(ctx context.Context, _ *principal) (string, error) {
			ctx, cancel := context.WithTimeout(ctx, probeWait)
			defer cancel()
			reply, err := d.c.ProbeRoute(ctx, id, client.ApplyProbe())
			if err != nil {
				return "", err
			}
			d.probes.set(*reply.Result)
			h := reply.Result
			if h.OK {
				return fmt.Sprintf("route %s answered in %d ms: %s, score %.0f", id, h.LatencyMS, reply.Route.State, reply.Route.Score), nil
			}
			return "", fmt.Errorf("route %s failed its probe at the %s stage (%s): %s; it is %s", id, h.Stage, h.Kind, h.Error, reply.Route.State)
		}})
}

func (d *Dashboard) jobAction(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	dd := deed{action: "job." + r.PathValue("action"), target: name, ev: wire.Event{JobID: name}, back: "/jobs/" + url.PathEscape(name)}
	// set pauses or resumes the job and says so.
	set := func(op func(ctx context.Context, name string) (client.JobInfo, error), done string) doer {
		return func(ctx context.Context, _ *principal) (string, error) {
			_, err := op(ctx, name)
			return fmt.Sprintf("job %s %s", name, done), err
		}
	}
	d.actOneOf(w, r, dd, "job", map[string]doer{
		ActionJobTrigger: func(ctx context.Context, _ *principal) (string, error) {
			run, err := d.c.TriggerJob(ctx, name)
			return fmt.Sprintf("job %s fired task %s", name, run.TaskID), err
		},
		ActionJobPause:  set(d.c.PauseJob, "is paused: it does not fire on schedule until resumed"),
		ActionJobResume: set(d.c.ResumeJob, "fires on schedule again"),
	})
}

// actOneOf takes the action dd names (see act), doing it with its entry in
// dos; an action dos does not hold is no action on a kind: 404.
func (d *Dashboard) actOneOf(w http.ResponseWriter, r *http.Request, dd deed, kind string, dos map[string]doer) {
	do, ok := dos[dd.action]
	if !ok {
		d.fail(w, r, http.StatusNotFound, fmt.Errorf("no %s action %q", kind, r.PathValue("action")))
		return
	}
	dd.do = do
	d.act(w, r, dd)
}

// act takes an action for the request's user: it refuses one the user's
// role does not allow, asks for a confirmation unless the form carries
// one, does it, records a DASHBOARD_ACTION event naming the user and
// returns to the page it came from with what happened.
func (d *Dashboard) act(w http.ResponseWriter, r *http.Request, dd deed) {
	p := principalOf(r)
	back := dd.back
	if b := r.PostFormValue("back"); b != "" {
		back = localPath(b)
	}
	if !p.Can(dd.action) {
		err := fmt.Errorf("the role %s of %s does not allow %s", p.Role, p.User, dd.action)
		d.record(r, p, dd, "refused", err)
		d.fail(w, r, http.StatusForbidden, err)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		d.render(w, r, http.StatusOK, "confirm", "Confirm", map[string]any{
			"Action": dd.action, "Verb": verbs[dd.action], "Target": dd.target, "URL": r.URL.Path, "Back": back,
		})
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), probeWait+5*time.Second)
	defer cancel()
	msg, err := dd.do(ctx, p)
	outcome := "done"
	if err != nil {
		outcome = "failed"
	}
	if rerr := d.record(r, p, dd, outcome, err); rerr != nil && err == nil {
		msg += " (but its audit event was not stored: " + rerr.Error() + ")"
	}
	f := &flash{Kind: "ok", Text: msg}
	if err != nil {
		f = &flash{Kind: "error", Text: verbs[dd.action] + " " + dd.target + ": " + err.Error()}
	}
	if p.sess != nil {
		d.session.setFlash(p.sess, f)
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// record publishes the DASHBOARD_ACTION event of an action.
func (d *Dashboard) record(r *http.Request, p *principal, dd deed, outcome string, err error) error {
	ev := dd.ev
	ev.Type = wire.EventDashboardAction
	ev.Level = wire.LevelInfo
	ev.Message = fmt.Sprintf("%s %s %s from the dashboard", p.User, verbs[dd.action], dd.target)
	pl := wire.DashboardAction{User: p.User, Role: string(p.Role), Action: dd.action, Remote: r.RemoteAddr, Outcome: outcome}
	if err != nil {
		ev.Level = wire.LevelWarn
		pl.Error = err.Error()
		ev.Message = fmt.Sprintf("%s: %s %s %s from the dashboard", outcome, p.User, verbs[dd.action], dd.target)
	}
	ev.Payload = audit.Payload(pl)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if eerr := d.em.Emit(ctx, ev); eerr != nil {
		d.log.Error("dashboard action not recorded", "user", p.User, "action", dd.action, "target", dd.target, "err", eerr)
		return eerr
	}
	return nil
}
