package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestJobGolden(t *testing.T) {
	t.Parallel()
	at := t0.Add(24 * time.Hour)
	started, finished := t0.Add(time.Second), t0.Add(3*time.Second)
	cases := map[string]any{
		"job": Job{
			Name: "poll-plc", Type: "exec", Queue: "plant", Payload: json.RawMessage(`{"cmd":["poll"]}`),
			Priority: 5, Timeout: "30s", MaxAttempts: 3, Resource: "plc1", Description: "poll the PLC",
			Cron: "*/5 * * * *", Timezone: "Europe/Berlin", Windows: []string{"06:00-22:00"},
			Jitter: "10s", Misfire: MisfireOnce, MisfireCap: 10, Overlap: OverlapForbid, MaxPerHour: 12,
			Cooldown: "1m", Paused: true, Source: JobSourceCLI, CreatedAt: t0, UpdatedAt: t0,
		},
		"job_at": Job{Name: "once", Type: "noop", At: &at, CreatedAt: t0, UpdatedAt: t0},
		"job_run": JobRun{
			Job: "poll-plc", TaskID: "poll-plc-1796008320", Planned: t0, Fired: t0.Add(time.Millisecond),
			Trigger: TriggerSchedule, Started: &started, Finished: &finished, State: TaskSucceeded,
			Attempts: 1, Machine: "plant-pc-1", Term: 3, RanOn: "plant-pc-2",
		},
		"job_state": JobState{
			Job: "poll-plc", LastPlanned: t0, LastFired: &t0, Active: []ActiveRun{{TaskID: "poll-plc-1796008320", Planned: t0}},
			RecentFires: []time.Time{t0},
		},
		"scheduler_leader": SchedulerLeader{ID: "sched-a", Host: "plant-pc-1", Term: 3, Since: t0},
	}
	for name, v := range cases {
		golden(t, name, v)
	}
}

func TestJobTaskID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("j", MaxJobNameLen)
	if id := ManualTaskID(long, time.Now()); !ValidTaskID(id) {
		t.Errorf("ValidTaskID(ManualTaskID(longest name)) = false, want true (len %d)", len(id))
	}
	planned := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	if got, want := JobTaskID("poll-plc", planned), "poll-plc-1796007600"; got != want {
		t.Errorf("JobTaskID = %q, want %q", got, want)
	}
	if got, want := JobTaskID("a", planned.In(time.FixedZone("x", 3600))), JobTaskID("a", planned); got != want {
		t.Errorf("JobTaskID in another zone = %q, want %q", got, want)
	}
	if got, want := ManualTaskID("a", planned.Add(5)), "a-manual-1796007600000000005"; got != want {
		t.Errorf("ManualTaskID = %q, want %q", got, want)
	}
}

func TestValidJobName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"poll-plc": true, "Job_1": true, "": false, "a.b": false, "a b": false, "a*": false,
		"a>": false, "ü": false, strings.Repeat("a", MaxJobNameLen): true, strings.Repeat("a", MaxJobNameLen+1): false,
	} {
		if got := ValidJobName(name); got != want {
			t.Errorf("ValidJobName(%q) = %v, want %v", name, got, want)
		}
	}
}
