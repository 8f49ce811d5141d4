package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/kv"
)

func TestEveryFiresTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "tick", Type: "noop", Queue: "plant", Every: "1m", Priority: 7,
		Payload: json.RawMessage(`{"sleep":"1s"}`), Resource: "cam1", MaxAttempts: 2, Timeout: "5s"})
	for i := 1; i <= 3; i++ {
		b.advance(time.Minute)
		got := b.waitTasks(i)
		m := got[i-1]
		planned := t0.Add(time.Duration(i) * time.Minute)
		want := wire.JobTaskID("tick", planned)
		if m.id != want || m.msgID != want {
			t.Errorf("task %d id = %q, msg id %q, want %q", i, m.id, m.msgID, want)
		}
		if m.subject != "gantry.tasks.plant.noop" || m.job != "tick" || !m.planned.Equal(planned) {
			t.Errorf("task %d subject %q job %q planned %s, want gantry.tasks.plant.noop tick %s", i, m.subject, m.job, m.planned, planned)
		}
		if m.task.Priority != 7 || m.task.Resource != "cam1" || m.task.MaxAttempts != 2 || m.task.Timeout != "5s" || string(m.task.Payload) != `{"sleep":"1s"}` {
			t.Errorf("task %d = %+v, want the job's priority, resource, attempts, timeout and payload", i, m.task)
		}
	}
	fired := b.waitEvents(wire.EventJobFired, 3)
	if fired[0].JobID != "tick" || fired[0].TaskID != wire.JobTaskID("tick", t0.Add(time.Minute)) {
		t.Errorf("JOB_FIRED = job %q task %q, want tick and the first task", fired[0].JobID, fired[0].TaskID)
	}
	if got := b.events(wire.EventLeaderElected); len(got) != 1 {
		t.Errorf("LEADER_ELECTED events = %d, want 1", len(got))
	}
}

func TestCronAndAt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	at := t0.Add(90 * time.Second)
	b.addJob(wire.Job{Name: "sec", Type: "noop", Cron: "*/30 * * * * *"})
	b.addJob(wire.Job{Name: "once", Type: "noop", At: &at})
	// 10:00:30, 10:01:00, 10:01:30 (+ once), 10:02:00
	for i := 0; i < 4; i++ {
		b.advance(30 * time.Second)
		b.waitEvents(wire.EventJobFired, i+1+min(max(i-1, 0), 1))
	}
	want := []string{
		"once-" + fmt.Sprint(at.Unix()),
		"sec-" + fmt.Sprint(t0.Add(30*time.Second).Unix()), "sec-" + fmt.Sprint(t0.Add(60*time.Second).Unix()),
		"sec-" + fmt.Sprint(t0.Add(90*time.Second).Unix()), "sec-" + fmt.Sprint(t0.Add(120*time.Second).Unix()),
	}
	got := ids(b.waitTasks(5))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tasks = %v, want %v", got, want)
	}
}

func TestPauseStopsTheVeryNextFire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "poll", Type: "noop", Every: "1m"})
	b.advance(time.Minute)
	b.waitTasks(1)
	b.modify("poll", func(j *wire.Job) { j.Paused = true })
	// No wait for the scheduler to see the pause: the fire itself must
	// check the live state.
	b.clk.Advance(time.Minute)
	skipped := b.waitEvents(wire.EventJobSkipped, 1)
	if r := payloadField(skipped[0], "reason"); r != string(wire.SkipPaused) {
		t.Errorf("skip reason = %v, want paused", r)
	}
	if got := b.taskMsgs(); len(got) != 1 {
		t.Fatalf("tasks after pause = %v, want only the first", ids(got))
	}
	b.modify("poll", func(j *wire.Job) { j.Paused = false })
	b.advance(time.Minute)
	got := b.waitTasks(2)
	if want := wire.JobTaskID("poll", t0.Add(3*time.Minute)); got[1].id != want {
		t.Errorf("task after resume = %q, want %q", got[1].id, want)
	}
}

func TestDeleteStopsFires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "gone", Type: "noop", Every: "1m"})
	b.addJob(wire.Job{Name: "stays", Type: "noop", Every: "1m"})
	b.advance(time.Minute)
	b.waitTasks(2)
	if err := b.jobs.Delete(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	b.clk.Advance(time.Minute)
	b.waitEvents(wire.EventJobFired, 3)
	got := b.waitTasks(3)
	if want := wire.JobTaskID("stays", t0.Add(2*time.Minute)); got[2].id != want {
		t.Errorf("third task = %q, want %q (the deleted job must not fire)", got[2].id, want)
	}
}

func TestWindowAndBudgetSkips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, stop := b.start(Config{}, true)
	// 10:00 UTC is 11:00 in Berlin: the window closes at 11:02 there.
	b.addJob(wire.Job{Name: "win", Type: "noop", Every: "1m", Windows: []string{"10:30-11:02"}, Timezone: "Europe/Berlin"})
	b.addJob(wire.Job{Name: "budget", Type: "noop", Every: "1m", MaxPerHour: 2})
	b.advance(time.Minute) // 11:01 Berlin: both fire
	b.waitEvents(wire.EventJobFired, 2)
	b.advance(time.Minute) // 11:02: win is outside its window
	b.waitEvents(wire.EventJobFired, 3)
	b.advance(time.Minute) // 11:03: budget has had its 2 fires this hour
	b.advance(time.Minute) // 11:04: win stays quiet until its window opens
	skipped := b.waitEvents(wire.EventJobSkipped, 3)
	reasons := map[string][]any{}
	for _, ev := range skipped {
		reasons[ev.JobID] = append(reasons[ev.JobID], payloadField(ev, "reason"))
	}
	// One summary for the whole time outside the window, not one a fire.
	if fmt.Sprint(reasons["win"]) != "[window]" || fmt.Sprint(reasons["budget"]) != "[budget budget]" {
		t.Errorf("skip reasons = %v, want win: [window], budget: [budget budget]", reasons)
	}
	for _, ev := range skipped {
		if ev.JobID != "win" {
			continue
		}
		// 11:02 Berlin to 10:29 the next day: 1408 planned times.
		if payloadField(ev, "skipped") != float64(1408) || payloadField(ev, "until") != "2026-12-01T09:30:00Z" {
			t.Errorf("win's JOB_SKIPPED = %q %s, want 1408 skipped until 10:30 Berlin the next day", ev.Message, ev.Payload)
		}
	}
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		if st, err := b.st.State(context.Background(), "win"); err != nil || st.SkipUntil == nil {
			return fmt.Errorf("State(win) = %+v, %v; want SkipUntil saved", st, err)
		}
		return nil
	})
	want := []string{wire.JobTaskID("budget", t0.Add(time.Minute)), wire.JobTaskID("budget", t0.Add(2*time.Minute)), wire.JobTaskID("win", t0.Add(time.Minute))}
	if got := ids(b.waitTasks(3)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tasks = %v, want %v", got, want)
	}
	// A scheduler restarted in the night knows those times were skipped:
	// no misfires for win.
	stop()
	b.clk.Advance(time.Hour)
	b.start(Config{}, true)
	b.waitEvents(wire.EventJobMissed, 1)
	for _, ev := range b.events(wire.EventJobMissed) {
		if ev.JobID == "win" {
			t.Errorf("JOB_MISSED for win after a restart outside its window: %q", ev.Message)
		}
	}
}

func TestMisfirePolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy   wire.MisfirePolicy
		cap      int
		misfires int
		missed   int
	}{
		{wire.MisfireSkip, 0, 0, 9},
		{wire.MisfireOnce, 0, 1, 8},
		{wire.MisfireAll, 5, 5, 4},
		{wire.MisfireAll, 0, 9, 0},
	} {
		t.Run(fmt.Sprintf("%s_%d", tc.policy, tc.cap), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// The job existed an hour ago and last fired 10 minutes ago;
			// the scheduler has been down since.
			j := wire.Job{Name: "m", Type: "noop", Every: "1m", Misfire: tc.policy, MisfireCap: tc.cap}
			j, _ = jobs.Normalize(j)
			j.CreatedAt, j.UpdatedAt = t0.Add(-time.Hour), t0.Add(-time.Hour)
			if _, err := b.jobs.Create(context.Background(), j); err != nil {
				t.Fatal(err)
			}
			b.putState(wire.JobState{Job: "m", LastPlanned: t0.Add(-10 * time.Minute)})
			b.start(Config{}, true)
			// Missed: 09:51 .. 09:59 (older than the 1m threshold); 10:00
			// is on time.
			got := b.waitTasks(tc.misfires + 1)
			for _, m := range got[:tc.misfires] {
				if m.planned.After(t0.Add(-time.Minute)) || m.planned.Before(t0.Add(-9*time.Minute)) {
					t.Errorf("misfire %s planned %s, want within 09:51..09:59", m.id, m.planned)
				}
			}
			if last := got[len(got)-1]; !last.planned.Equal(t0) {
				t.Errorf("last task planned %s, want %s", last.planned, t0)
			}
			if tc.misfires > 0 && !got[tc.misfires-1].planned.Equal(t0.Add(-time.Minute)) {
				t.Errorf("latest misfire planned %s, want the latest missed time %s", got[tc.misfires-1].planned, t0.Add(-time.Minute))
			}
			if tc.missed > 0 {
				if ev := b.waitEvents(wire.EventJobMissed, tc.missed); len(ev) != tc.missed {
					t.Errorf("JOB_MISSED = %d, want %d", len(ev), tc.missed)
				}
			}
			check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
				if st, err := b.st.State(context.Background(), "m"); err != nil || !st.LastPlanned.Equal(t0) {
					return fmt.Errorf("State(m) LastPlanned = %s, %v; want %s saved", st.LastPlanned, err, t0)
				}
				return nil
			})
			if ev := b.events(wire.EventJobMissed); len(ev) != tc.missed {
				t.Errorf("JOB_MISSED = %d, want %d", len(ev), tc.missed)
			}
		})
	}
}

func TestOverlapForbidAndRunHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "slow", Type: "noop", Every: "1m", Overlap: wire.OverlapForbid})
	b.advance(time.Minute)
	first := b.waitTasks(1)[0]
	for i := 1; i <= 2; i++ {
		b.advance(time.Minute)
		ev := b.waitEvents(wire.EventJobSkipped, i)
		if r := payloadField(ev[i-1], "reason"); r != string(wire.SkipOverlap) {
			t.Errorf("skip %d reason = %v, want overlap", i, r)
		}
	}
	if got := b.taskMsgs(); len(got) != 1 {
		t.Fatalf("tasks while the first runs = %v, want 1", ids(got))
	}
	b.finishTask(first.id, wire.TaskSucceeded)
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		if r, err := b.st.Run(context.Background(), "slow", first.planned); err != nil || r.State != wire.TaskSucceeded || r.Finished == nil {
			return fmt.Errorf("Run(slow, %s) = %+v, %v; want SUCCEEDED and finished", first.planned, r, err)
		}
		return nil
	})
	b.advance(time.Minute)
	got := b.waitTasks(2)
	if want := wire.JobTaskID("slow", t0.Add(4*time.Minute)); got[1].id != want {
		t.Errorf("task after the first finished = %q, want %q", got[1].id, want)
	}
	// The run is recorded once the task's publish is acknowledged, an
	// instant after the task shows in the stream.
	var runs []wire.JobRun
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		var err error
		if runs, err = b.st.Runs(context.Background(), "slow", 0); err != nil || len(runs) != 2 {
			return fmt.Errorf("Runs(slow) = %d runs, %v; want 2", len(runs), err)
		}
		return nil
	})
	if len(runs) != 2 || runs[0].State != wire.TaskSucceeded || runs[1].State != wire.TaskWaiting || runs[0].Machine == "" || runs[0].Term == 0 || runs[0].RanOn != "worker-host" {
		t.Errorf("runs = %+v, want the first SUCCEEDED on worker-host and the second WAITING, with machine and term", runs)
	}
}

func TestOverlapReplaceCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cancels := make(chan string, 4)
	sub, err := b.env.NC.Subscribe(wire.SubjectTaskCancel, func(m *nats.Msg) {
		var req wire.TaskCancelRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			cancels <- "malformed: " + string(m.Data)
			return
		}
		cancels <- req.ID
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "rep", Type: "noop", Every: "1m", Overlap: wire.OverlapReplace})
	b.advance(time.Minute)
	first := b.waitTasks(1)[0]
	b.advance(time.Minute)
	b.waitTasks(2)
	select {
	case id := <-cancels:
		if id != first.id {
			t.Errorf("cancelled %q, want %q", id, first.id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no cancel request for the replaced run")
	}
}

func TestResourceCooldown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "cam", Type: "noop", Every: "1m", Resource: "cam1", Cooldown: "150s"})
	b.advance(time.Minute)
	first := b.waitTasks(1)[0]
	b.finishTask(first.id, wire.TaskSucceeded)
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		want := t0.Add(time.Minute + 150*time.Second)
		if c, err := b.st.Cooldowns(context.Background()); err != nil || !c["cam1"].Equal(want) {
			return fmt.Errorf("Cooldowns = %v, %v; want cam1 until %s", c, err, want)
		}
		return nil
	})
	b.advance(time.Minute) // 10:02: cooling down until 10:03:30
	ev := b.waitEvents(wire.EventJobSkipped, 1)
	if r := payloadField(ev[0], "reason"); r != string(wire.SkipCooldown) {
		t.Errorf("skip reason = %v, want cooldown", r)
	}
	b.advance(time.Minute) // 10:03: still cooling down
	b.waitEvents(wire.EventJobSkipped, 2)
	b.advance(time.Minute) // 10:04: fires
	if got := b.waitTasks(2); got[1].id != wire.JobTaskID("cam", t0.Add(4*time.Minute)) {
		t.Errorf("task after cooldown = %q, want the 10:04 fire", got[1].id)
	}
}

func TestConcurrencyCapCountsTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{MaxPerType: map[string]int{"exec": 1}}, true)
	b.addJob(wire.Job{Name: "hi", Type: "exec", Every: "1m", Priority: 9})
	b.addJob(wire.Job{Name: "lo", Type: "exec", Every: "1m", Priority: 1})
	b.addJob(wire.Job{Name: "other", Type: "noop", Every: "1m"})
	b.advance(time.Minute)
	ev := b.waitEvents(wire.EventJobSkipped, 1)
	if ev[0].JobID != "lo" || payloadField(ev[0], "reason") != string(wire.SkipConcurrency) {
		t.Errorf("skipped %s (%v), want lo for concurrency: the higher priority job fires first", ev[0].JobID, payloadField(ev[0], "reason"))
	}
	got := ids(b.waitTasks(2))
	want := []string{wire.JobTaskID("hi", t0.Add(time.Minute)), wire.JobTaskID("other", t0.Add(time.Minute))}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("tasks = %v, want %v", got, want)
	}
}

// A task a prioritized queue's sorter moved to gantry.ready counts too.
func TestConcurrencyCapCountsSortedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.env.JS.Publish(context.Background(), wire.ReadySubject("urgent", "exec"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	b.start(Config{MaxPerType: map[string]int{"exec": 1}}, true)
	b.addJob(wire.Job{Name: "hi", Type: "exec", Every: "1m"})
	b.advance(time.Minute)
	ev := b.waitEvents(wire.EventJobSkipped, 1)
	if ev[0].JobID != "hi" || payloadField(ev[0], "reason") != string(wire.SkipConcurrency) {
		t.Errorf("skipped %s (%v), want hi for concurrency", ev[0].JobID, payloadField(ev[0], "reason"))
	}
}

func TestTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	b.addJob(wire.Job{Name: "manual", Type: "noop", Every: "1h", Overlap: wire.OverlapForbid, Paused: true})
	ask := func(job string) (wire.JobRun, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var run wire.JobRun
		err := rpc.Request(ctx, b.env.NC, wire.SubjectSchedulerTrigger, wire.TriggerRequest{Job: job}, &run)
		return run, err
	}
	var (
		run wire.JobRun
		err error
	)
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		if run, err = ask("manual"); errors.Is(err, kv.ErrNotFound) || errors.Is(err, rpc.ErrNoResponders) {
			return fmt.Errorf("trigger(manual) = %w, want the scheduler to have loaded the job", err)
		}
		return nil
	})
	if err != nil || run.Trigger != wire.TriggerManual {
		t.Fatalf("trigger = %+v, %v; want a manual run (a paused job can be triggered by hand)", run, err)
	}
	if got := b.waitTasks(1); got[0].id != run.TaskID {
		t.Errorf("task = %q, want %q", got[0].id, run.TaskID)
	}
	var re *rpc.Error
	if _, err := ask("manual"); !errors.Is(err, kv.ErrConflict) || !errors.As(err, &re) || re.Code != rpc.CodeConflict {
		t.Errorf("second trigger while running = %v, want a 409 matching kv.ErrConflict", err)
	}
	if _, err := ask("nope"); !errors.Is(err, kv.ErrNotFound) || !errors.As(err, &re) || re.Code != rpc.CodeNotFound {
		t.Errorf("trigger of a missing job = %v, want a 404 matching kv.ErrNotFound", err)
	}
	if _, err := ask(""); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("trigger without a job = %v, want a 400 matching kv.ErrInvalid", err)
	}
}

func TestBadJobIsRejectedAndAudited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{}, true)
	kvb, err := b.env.JS.KeyValue(context.Background(), wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	// Bad values any client can write: each is rejected with an event and
	// the scheduler carries on. "TZ=UTC" made robfig/cron, the parser used
	// before, panic and every scheduler crash-loop.
	bad := map[string]string{
		"broken":   `{"name":"broken","type":"noop","cron":"not a cron"}`,
		"tz":       `{"type":"noop","cron":"TZ=UTC"}`,
		"tz-5":     `{"type":"noop","cron":"TZ=UTC 0 * * * *"}`,
		"garbage":  `garbage`,
		"misnamed": `{"name":"other","type":"noop","every":"1m"}`,
	}
	for key, v := range bad {
		if _, err := kvb.Put(context.Background(), key, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// A valid job written by another client, without name, queue or
	// policies, fires with the defaults under its key.
	if _, err := kvb.Put(context.Background(), "fine", []byte(`{"type":"noop","every":"1m","created_at":"2026-11-30T10:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	ev := b.waitEvents(wire.EventConfigRejected, len(bad))
	rejected := map[string]bool{}
	for _, e := range ev {
		rejected[e.JobID] = true
	}
	for key := range bad {
		if !rejected[key] {
			t.Errorf("CONFIG_REJECTED for %s missing; got events for %v", key, rejected)
		}
	}
	b.advance(time.Minute)
	if got := b.waitTasks(1); got[0].job != "fine" || got[0].subject != "gantry.tasks.default.noop" {
		t.Errorf("task of job %q on %s, want fine on gantry.tasks.default.noop", got[0].job, got[0].subject)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	newScheduler := func(t testing.TB, env *brokertest.Env) *Scheduler {
		s, err := New(Config{Logger: env.Log, LeaderTTL: time.Second}, env.JS)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("misuse", func(t *testing.T) {
		lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor { return newScheduler(t, env) })
	})
	t.Run("failed start", func(t *testing.T) {
		// A broker of its own, without the jobs bucket.
		env := brokertest.Start(t)
		if err := env.JS.DeleteKeyValue(context.Background(), wire.BucketJobs); err != nil {
			t.Fatal(err)
		}
		lifecycletest.FailedStart(t, newScheduler(t, env))
	})
}

func TestNewRejectsFractionalTTL(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	if _, err := New(Config{LeaderTTL: 1500 * time.Millisecond}, env.JS); err == nil {
		t.Error("New with a TTL of 1.5s = nil error, want one")
	}
}

func TestReconcileFromTaskBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(Config{ReconcileInterval: 5 * time.Minute}, true)
	b.addJob(wire.Job{Name: "rec", Type: "noop", Every: "1m", Overlap: wire.OverlapForbid})
	b.advance(time.Minute)
	first := b.waitTasks(1)[0]
	// The worker's end event never came, but its record says it failed.
	tasks, err := b.env.JS.KeyValue(context.Background(), wire.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(wire.TaskInfo{ID: first.id, Type: "noop", Queue: "default", State: wire.TaskNeedsReview,
		Attempts: 3, LastError: "exit status 2", UpdatedAt: t0.Add(90 * time.Second)})
	if _, err := tasks.Put(context.Background(), first.id, rec); err != nil {
		t.Fatal(err)
	}
	b.advance(5 * time.Minute)
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		r, err := b.st.Run(context.Background(), "rec", first.planned)
		if err != nil || r.State != wire.TaskNeedsReview || r.Attempts != 3 || r.Error != "exit status 2" {
			return fmt.Errorf("Run(rec, %s) = %+v, %v; want NEEDS_REVIEW after 3 attempts with exit status 2, from gantry_tasks", first.planned, r, err)
		}
		return nil
	})
}

func TestMisfireSummary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, _ := jobs.Normalize(wire.Job{Name: "long", Type: "noop", Every: "1m", Misfire: wire.MisfireSkip})
	j.CreatedAt, j.UpdatedAt = t0.Add(-24*time.Hour), t0.Add(-24*time.Hour)
	if _, err := b.jobs.Create(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	b.putState(wire.JobState{Job: "long", LastPlanned: t0.Add(-200 * time.Minute)})
	b.start(Config{}, true)
	// 199 missed (t0-199m .. t0-1m): 100 events, then one summary.
	ev := b.waitEvents(wire.EventJobMissed, maxMissedEvents+1)
	last := ev[len(ev)-1]
	if len(ev) != maxMissedEvents+1 || payloadField(last, "count") != float64(99) {
		t.Errorf("JOB_MISSED = %d, last %q %s, want %d with a summary counting 99", len(ev), last.Message, last.Payload, maxMissedEvents+1)
	}
	if got := b.waitTasks(1); !got[0].planned.Equal(t0) {
		t.Errorf("task planned %s, want only the on-time %s", got[0].planned, t0)
	}
}

// TestMisfireOnceAfterShortDowntime: a 10 s job down about 90 s fires
// once at restart under misfire once, not the misfire plus every planned
// time within the threshold (7 tasks before).
func TestMisfireOnceAfterShortDowntime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, _ := jobs.Normalize(wire.Job{Name: "tick", Type: "noop", Every: "10s", Misfire: wire.MisfireOnce})
	j.CreatedAt, j.UpdatedAt = t0.Add(-time.Hour), t0.Add(-time.Hour)
	if _, err := b.jobs.Create(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	// Last fired at 09:58:30, back at 10:00:04: 09:58:40 .. 10:00:00 missed.
	b.putState(wire.JobState{Job: "tick", LastPlanned: t0.Add(-90 * time.Second)})
	b.clk.Advance(4 * time.Second)
	b.start(Config{}, true)
	got := b.waitTasks(1)
	if !got[0].planned.Equal(t0) {
		t.Errorf("task planned %s, want the latest missed time %s", got[0].planned, t0)
	}
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		if st, err := b.st.State(context.Background(), "tick"); err != nil || !st.LastPlanned.Equal(t0) {
			return fmt.Errorf("State(tick) LastPlanned = %s, %v; want %s saved", st.LastPlanned, err, t0)
		}
		return nil
	})
	if ev := b.waitEvents(wire.EventJobMissed, 8); len(ev) != 8 {
		t.Errorf("JOB_MISSED = %d, want 8 (09:58:40 .. 09:59:50)", len(ev))
	}
	if n := len(b.taskMsgs()); n != 1 {
		t.Errorf("tasks after restart = %d, want 1", n)
	}
	// The next one is on schedule.
	b.advance(6 * time.Second)
	if got := b.waitTasks(2); !got[1].planned.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("next task planned %s, want %s", got[1].planned, t0.Add(10*time.Second))
	}
}
