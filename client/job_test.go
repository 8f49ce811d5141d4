package client_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/scheduler"
)

func TestJobsThroughScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)

	// No scheduler leads yet: a trigger has nobody to ask.
	if _, err := c.TriggerJob(ctx, "tick"); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("TriggerJob without a scheduler = %v, want ErrUnavailable", err)
	}
	s, err := scheduler.New(scheduler.Config{LeaderTTL: time.Second, Logger: b.env.Log}, b.env.JS)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s)
	check.That(t, 20*time.Second, "the scheduler leading", func() bool { leading, _ := s.Leading(); return leading })

	info, err := c.AddJob(ctx, client.Job{Name: "tick", Type: "noop", Every: "1h", Overlap: wire.OverlapForbid, Source: wire.JobSourceCLI})
	if err != nil || info.Name != "tick" || info.NextFire == nil || info.Paused {
		t.Fatalf("AddJob = %+v, %v; want tick with a next fire", info, err)
	}
	if info, err = c.PauseJob(ctx, "tick"); err != nil || !info.Paused || info.NextFire != nil {
		t.Errorf("PauseJob = paused %v, next %v, %v; want paused, no next fire", info.Paused, info.NextFire, err)
	}
	// A re-add keeps the operator's pause.
	if info, err = c.AddJob(ctx, client.Job{Name: "tick", Type: "noop", Every: "2h", Overlap: wire.OverlapForbid}); err != nil || !info.Paused || info.Every != "2h" {
		t.Errorf("AddJob again = paused %v, every %s, %v; want still paused, every 2h", info.Paused, info.Every, err)
	}

	// A trigger fires even a paused job; no workers run, so its run stays
	// unfinished and the job forbids another.
	var run1 client.JobRun
	// The leader may not know the job yet (not found), nor serve triggers
	// yet an instant after it leads (unavailable).
	check.That(t, 20*time.Second, "a trigger the scheduler accepts", func() bool {
		run1, err = c.TriggerJob(ctx, "tick")
		return !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrUnavailable)
	})
	if err != nil || run1.Trigger != wire.TriggerManual || run1.Job != "tick" {
		t.Fatalf("TriggerJob = %+v, %v; want a manual run of tick", run1, err)
	}
	var se *client.ServiceError
	if _, err := c.TriggerJob(ctx, "tick"); !errors.Is(err, client.ErrConflict) || !errors.As(err, &se) || se.Code != "409" {
		t.Errorf("TriggerJob while its run is unfinished = %v, want a 409 matching ErrConflict", err)
	}
	if _, err := c.TriggerJob(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("TriggerJob(nope) = %v, want ErrNotFound", err)
	}
	check.That(t, 20*time.Second, "the run recorded", func() bool {
		runs, err := c.JobRuns(ctx, "tick", 0)
		return err == nil && len(runs) == 1 && runs[0].TaskID == run1.TaskID
	})
	if info, err = c.Job(ctx, "tick"); err != nil || len(info.Running) != 1 || info.Running[0] != run1.TaskID || info.LastFired == nil {
		t.Errorf("Job = running %v, last fired %v, %v; want the triggered run", info.Running, info.LastFired, err)
	}

	// A bad definition is refused and audited.
	if _, err := c.AddJob(ctx, client.Job{Name: "bad", Type: "noop", Cron: "61 * * * *"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("AddJob with a bad cron = %v, want ErrInvalid", err)
	}
	page, err := b.env.JS.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := page.GetLastMsgForSubject(ctx, wire.EventConfigRejected.Subject()); err != nil || len(m.Data) == 0 {
		t.Errorf("CONFIG_REJECTED = %v, want the bad job's event", err)
	}

	list, bad, err := c.Jobs(ctx)
	if err != nil || len(list) != 1 || len(bad) != 0 {
		t.Errorf("Jobs = %d jobs, %d bad, %v; want tick only", len(list), len(bad), err)
	}
	if _, err := c.ResumeJob(ctx, "tick"); err != nil {
		t.Errorf("ResumeJob = %v, want nil", err)
	}
	if err := c.RemoveJob(ctx, "tick"); err != nil {
		t.Errorf("RemoveJob = %v, want nil", err)
	}
	for name, err := range map[string]error{
		"Job":       func() error { _, err := c.Job(ctx, "tick"); return err }(),
		"JobRuns":   func() error { _, err := c.JobRuns(ctx, "nope", 0); return err }(),
		"PauseJob":  func() error { _, err := c.PauseJob(ctx, "tick"); return err }(),
		"RemoveJob": c.RemoveJob(ctx, "tick"),
	} {
		if !errors.Is(err, client.ErrNotFound) {
			t.Errorf("%s of a removed job = %v, want ErrNotFound", name, err)
		}
	}
}

// TestJobsStatus: Jobs shows what the schedulers make of each job: a job
// written without a queue on the default queue, a definition they refuse
// and a value that is not a job as rejected with the reason, a paused one
// paused; the next fire respects the windows.
func TestJobsStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)
	kv, err := b.env.JS.KeyValue(ctx, wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	for key, val := range map[string]string{
		"noqueue": `{"type":"noop","every":"1m"}`,
		"wrong":   `{"type":"noop","every":"1.5s"}`,
		"junk":    `not json`,
		"held":    `{"type":"noop","every":"1m","paused":true}`,
		"night":   `{"type":"noop","every":"10s","windows":["06:00-06:01"]}`,
	} {
		if _, err := kv.PutString(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	list, _, err := c.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]client.JobInfo{}
	for _, j := range list {
		got[j.Name] = j
	}
	if j := got["noqueue"]; j.Status != client.JobActive || j.Queue != wire.DefaultQueue || j.NextFire == nil {
		t.Errorf("noqueue = status %q, queue %q, next %v; want active on %q with a next fire", j.Status, j.Queue, j.NextFire, wire.DefaultQueue)
	}
	for _, name := range []string{"wrong", "junk"} {
		if j := got[name]; j.Status != client.JobRejected || j.Reason == "" || j.NextFire != nil {
			t.Errorf("%s = status %q, reason %q, next %v; want rejected with a reason, no next fire", name, j.Status, j.Reason, j.NextFire)
		}
	}
	if j := got["held"]; j.Status != client.JobPaused {
		t.Errorf("held = status %q, want paused", j.Status)
	}
	if j := got["night"]; j.NextFire == nil || j.NextFire.UTC().Hour() != 6 || j.NextFire.UTC().Minute() != 0 {
		t.Errorf("night next fire = %v, want within 06:00-06:01 UTC", j.NextFire)
	}
	fires, err := c.NextFires(ctx, "night", 7)
	if err != nil || len(fires) != 7 || fires[6].Planned.Sub(fires[0].Planned) < 23*time.Hour {
		t.Errorf("NextFires(night, 7) = %v, %v; want six fires in one window, the seventh a day later", fires, err)
	}
}

// TestJobPayloadSecretsRedacted: what Job, Jobs and AddJob return for
// display carries the payload redacted; the stored job, which schedulers
// fire, keeps it whole.
func TestJobPayloadSecretsRedacted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)
	payload := json.RawMessage(`{"cmd":["backup.sh"],"env":{"DB_PASSWORD":"swordfish","MODE":"full"}}`)
	added, err := c.AddJob(ctx, client.Job{Name: "nightly", Type: "exec", Every: "24h", Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Job(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	list, _, err := c.Jobs(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Jobs = %v, %v; want one job", list, err)
	}
	for what, p := range map[string]json.RawMessage{"AddJob": added.Payload, "Job": got.Payload, "Jobs": list[0].Payload} {
		if strings.Contains(string(p), "swordfish") || !strings.Contains(string(p), "full") {
			t.Errorf("%s payload = %s, want DB_PASSWORD redacted and MODE kept", what, p)
		}
	}
	store, err := jobs.NewStore(ctx, b.env.JS)
	if err != nil {
		t.Fatal(err)
	}
	stored, _, err := store.Get(ctx, "nightly")
	if err != nil || !strings.Contains(string(stored.Payload), "swordfish") {
		t.Errorf("stored payload = %s, %v; want it whole for the schedulers", stored.Payload, err)
	}
}
