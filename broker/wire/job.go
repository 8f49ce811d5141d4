package wire

import (
	"encoding/json"
	"strconv"
	"time"
)

// Job is a scheduled job: the value of the job's key (its name) in
// BucketJobs. `gantry job add`, the config file and any NATS client write
// it; every scheduler watches the bucket and fires the job's task on
// gantry.tasks.<queue>.<type> when its trigger says so.
//
// Exactly one trigger is set: Cron, Every or At. Durations are Go duration
// strings ("30s"), like Task.Timeout.
type Job struct {
	// Name is the job's key: letters, digits, '-' and '_' (see ValidJobName).
	Name string `json:"name"`
	// Type is the task type fired; Queue its queue (DefaultQueue when empty).
	Type  string `json:"type"`
	Queue string `json:"queue,omitempty"`
	// Payload, Priority, Timeout, MaxAttempts and Resource are copied into
	// every task the job fires.
	Payload     json.RawMessage `json:"payload,omitempty"`
	Priority    int             `json:"priority,omitempty"`
	Timeout     string          `json:"timeout,omitempty"`
	MaxAttempts int             `json:"max_attempts,omitempty"`
	Resource    string          `json:"resource,omitempty"`
	Description string          `json:"description,omitempty"`

	// Cron is a cron expression (5 fields, or 6 with seconds first, or a
	// descriptor such as @daily), read in Timezone.
	Cron string `json:"cron,omitempty"`
	// Every fires at every multiple of this interval since the Unix epoch.
	Every string `json:"every,omitempty"`
	// At fires once, at this time.
	At *time.Time `json:"at,omitempty"`
	// Timezone is the IANA zone Cron and Windows are read in. Empty means
	// UTC.
	Timezone string `json:"timezone,omitempty"`

	// Windows are the times of day ("HH:MM-HH:MM", in Timezone; may wrap
	// midnight) a fire is allowed in. Empty means always.
	Windows []string `json:"windows,omitempty"`
	// Jitter delays each fire by a deterministic amount in [0, Jitter).
	Jitter string `json:"jitter,omitempty"`
	// Misfire says what to do with planned times missed while no scheduler
	// led; MisfireCap bounds how many are fired under MisfireAll.
	Misfire    MisfirePolicy `json:"misfire,omitempty"`
	MisfireCap int           `json:"misfire_cap,omitempty"`
	// Overlap says what to do when the previous run has not finished.
	Overlap OverlapPolicy `json:"overlap,omitempty"`
	// MaxPerHour caps the fires in any sliding hour; 0 means no cap.
	MaxPerHour int `json:"max_per_hour,omitempty"`
	// Cooldown keeps every job on the same Resource from firing until this
	// long after a run on it finished.
	Cooldown string `json:"cooldown,omitempty"`

	// Paused jobs do not fire on schedule.
	Paused bool `json:"paused,omitempty"`
	// Source is who wrote the job: JobSourceConfig or JobSourceCLI.
	Source    string    `json:"source,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Job sources.
const (
	// JobSourceConfig marks a job applied from the config file.
	JobSourceConfig = "config"
	// JobSourceCLI marks a job written by `gantry job add` or another client.
	JobSourceCLI = "cli"
)

// MisfirePolicy says what a scheduler does with planned times that passed
// while no scheduler led.
type MisfirePolicy string

// The misfire policies.
const (
	// MisfireSkip fires none of the missed times; each is a JOB_MISSED event.
	MisfireSkip MisfirePolicy = "skip"
	// MisfireOnce fires the latest missed time once.
	MisfireOnce MisfirePolicy = "once"
	// MisfireAll fires every missed time, up to the job's MisfireCap.
	MisfireAll MisfirePolicy = "all"
)

// OverlapPolicy says what a scheduler does when a job's previous run has not
// finished at its next fire.
type OverlapPolicy string

// The overlap policies.
const (
	// OverlapAllow fires anyway.
	OverlapAllow OverlapPolicy = "allow"
	// OverlapForbid skips the fire (JOB_SKIPPED, reason overlap).
	OverlapForbid OverlapPolicy = "forbid"
	// OverlapReplace cancels the running task and fires.
	OverlapReplace OverlapPolicy = "replace"
)

// SkipReason is why a planned fire did not happen: the "reason" of a
// JOB_SKIPPED event's payload.
type SkipReason string

// The skip reasons.
const (
	SkipPaused      SkipReason = "paused"
	SkipWindow      SkipReason = "window"
	SkipBudget      SkipReason = "budget"
	SkipOverlap     SkipReason = "overlap"
	SkipCooldown    SkipReason = "cooldown"
	SkipConcurrency SkipReason = "concurrency"
)

// Trigger kinds of a JobRun.
const (
	// TriggerSchedule is a fire at a planned time.
	TriggerSchedule = "schedule"
	// TriggerMisfire is a late fire of a missed planned time.
	TriggerMisfire = "misfire"
	// TriggerManual is a fire asked for by `gantry job trigger`.
	TriggerManual = "manual"
)

// Headers the scheduler sets on every task message it publishes, besides
// Nats-Msg-Id (= the task id).
const (
	// HeaderJob names the job that fired the task.
	HeaderJob = "Gantry-Job"
	// HeaderPlanned is the planned fire time (RFC 3339, nanoseconds).
	HeaderPlanned = "Gantry-Planned"
)

// JobRun is one fire of a job and what became of it: the scheduler's run
// history, kept in BucketScheduler and read by `gantry job runs NAME`.
type JobRun struct {
	Job    string `json:"job"`
	TaskID string `json:"task_id"`
	// Planned is the time the trigger named; Fired when the task was
	// published (Planned + jitter + lag).
	Planned time.Time `json:"planned"`
	Fired   time.Time `json:"fired"`
	// Trigger is TriggerSchedule, TriggerMisfire or TriggerManual.
	Trigger string `json:"trigger"`
	// Started and Finished come from the task's audit events.
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
	// State is WAITING until the task starts, then the task's state.
	State    TaskState `json:"state"`
	Error    string    `json:"error,omitempty"`
	Attempts int       `json:"attempts,omitempty"`
	// Machine is the host of the scheduler that fired it; Term its fencing
	// term.
	Machine string `json:"machine"`
	Term    uint64 `json:"term"`
	// RanOn is the host of the worker that ran the task, from its events.
	RanOn string `json:"ran_on,omitempty"`
}

// JobState is what the leading scheduler remembers of a job between fires,
// in BucketScheduler, so that a new leader continues where the last one
// stopped.
type JobState struct {
	Job string `json:"job"`
	// LastPlanned is the latest planned time handled (fired, skipped or
	// missed); misfires are counted from it.
	LastPlanned time.Time `json:"last_planned"`
	// LastFired is when the job last fired.
	LastFired *time.Time `json:"last_fired,omitempty"`
	// Active are the fired tasks not yet finished.
	Active []ActiveRun `json:"active,omitempty"`
	// RecentFires are the fire times of the last hour, for MaxPerHour.
	RecentFires []time.Time `json:"recent_fires,omitempty"`
	// SkipUntil is the next planned time inside the job's windows when the
	// planned times before it were skipped as outside them, all in one
	// JOB_SKIPPED; a change of the job after LastPlanned voids it.
	SkipUntil *time.Time `json:"skip_until,omitempty"`
}

// ActiveRun names a fired task whose end the scheduler waits for.
type ActiveRun struct {
	TaskID  string    `json:"task_id"`
	Planned time.Time `json:"planned"`
}

// SchedulerLeader is the value of the leader key in BucketScheduler: the
// scheduler that leads, under a per-key TTL renewed by compare-and-swap.
type SchedulerLeader struct {
	// ID identifies the scheduler process; Host is its machine.
	ID   string `json:"id"`
	Host string `json:"host"`
	// Term is the fencing term: it grows with every election, and a
	// scheduler fires only while the leader key still holds its term.
	Term  uint64    `json:"term"`
	Since time.Time `json:"since"`
}

// TriggerRequest is the body of a request on SubjectSchedulerTrigger, sent
// by `gantry job trigger`. The leading scheduler answers with the JobRun it
// started; a job that does not exist is a 404, one whose unfinished run
// forbids another a 409, a scheduler that no longer leads a 503.
type TriggerRequest struct {
	Job string `json:"job"`
}

// SubjectSchedulerTrigger is the endpoint of the "gantry-scheduler" service
// that only the leading scheduler registers: fire a job now.
const SubjectSchedulerTrigger = "gantry.api.scheduler.trigger"

// SchedulerServiceName is the micro service the leading scheduler registers
// (`nats micro ls`): its endpoint is SubjectSchedulerTrigger.
const SchedulerServiceName = "gantry-scheduler"

// JobTaskID returns the deterministic id (and Nats-Msg-Id) of the task a job
// fires for a planned time, so that two schedulers firing the same planned
// time publish one task.
func JobTaskID(job string, planned time.Time) string {
	return job + "-" + strconv.FormatInt(planned.Unix(), 10)
}

// ManualTaskID returns the id of the task `gantry job trigger` fires at t.
func ManualTaskID(job string, t time.Time) string {
	return job + "-manual-" + strconv.FormatInt(t.UnixNano(), 10)
}

// MaxJobNameLen bounds the length of a job name, so that the ids of the
// tasks it fires stay within MaxTaskIDLen.
const MaxJobNameLen = 96

// ValidJobName reports whether name can name a job: 1 to MaxJobNameLen
// letters, digits, '-' or '_'. Names are KV keys and parts of task ids.
func ValidJobName(name string) bool {
	if name == "" || len(name) > MaxJobNameLen {
		return false
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
		if !ok {
			return false
		}
	}
	return true
}
