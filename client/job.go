package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/jobs"
)

// noScheduler says what to start when no scheduler leads.
const noScheduler = "no scheduler leads: start 'gantry run' or 'gantry scheduler'"

// The statuses of a job, as JobInfo.Status reports them.
const (
	// JobActive fires on schedule.
	JobActive = "active"
	// JobPaused does not fire on schedule until resumed.
	JobPaused = "paused"
	// JobRejected is a definition the schedulers refuse (JobInfo.Reason
	// says why): it does not fire.
	JobRejected = "rejected"
)

// JobInfo is a job with its status, its next fire and what the leading
// scheduler last did with it.
type JobInfo struct {
	Job
	// Status is JobActive, JobPaused or JobRejected: what the schedulers
	// make of the job, judged by the validator they use (jobs.Normalize).
	Status string `json:"status"`
	// Reason says why a rejected job is refused.
	Reason string `json:"reason,omitempty"`
	// NextFire is the moment of the next fire: jitter included, planned
	// times outside the job's windows passed over. Nil for a paused or
	// rejected job or one that will not fire again.
	NextFire *time.Time `json:"next_fire"`
	// LastFired is when the job last fired.
	LastFired *time.Time `json:"last_fired"`
	// Running are the ids of the job's fired tasks not yet finished.
	Running []string `json:"running"`
}

// jobInfo returns j, with its defaults filled as the schedulers fill them,
// its status and next fire, and with what st says when st is not nil. Its
// payload is redacted (wire.RedactJSON): it is for display, and the
// schedulers read the job itself.
func jobInfo(j Job, st *wire.JobState) JobInfo {
	j.Payload = wire.RedactJSON(j.Payload)
	info := JobInfo{Job: j, Status: JobActive, Running: []string{}}
	n, err := jobs.Normalize(j)
	var spec *jobs.Spec
	if err == nil {
		spec, err = jobs.Compile(n)
	}
	switch {
	case err != nil:
		info.Status, info.Reason = JobRejected, err.Error()
	case j.Paused:
		info.Job, info.Status = n, JobPaused
	default:
		info.Job = n
		if next := spec.NextInWindow(time.Now()).At; !next.IsZero() {
			info.NextFire = &next
		}
	}
	if st != nil {
		info.LastFired = st.LastFired
		for _, r := range st.Active {
			info.Running = append(info.Running, r.TaskID)
		}
	}
	return info
}

// AddJob stores job j, or changes the job of its name, through jobs.Apply:
// an existing job keeps its paused state (an operator's pause survives a
// re-add) and creation time. Every scheduler takes the change at once. A
// bad definition is ErrInvalid, and a CONFIG_REJECTED audit event.
func (c *Client) AddJob(ctx context.Context, j Job) (JobInfo, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.jobStore(ctx)
	if err != nil {
		return JobInfo{}, err
	}
	stored, err := jobs.Apply(ctx, store, j, time.Now().UTC())
	if errors.Is(err, ErrInvalid) {
		if eerr := c.em.Emit(ctx, wire.Event{Type: wire.EventConfigRejected, Level: wire.LevelWarn, JobID: j.Name,
			Message: "job rejected: " + err.Error()}); eerr != nil {
			c.set.log.Warn("job rejection not recorded", "job", j.Name, "err", eerr)
		}
	}
	if err != nil {
		return JobInfo{}, err
	}
	return jobInfo(stored, nil), nil
}

// Job returns job name.
func (c *Client) Job(ctx context.Context, name string) (JobInfo, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, st, err := c.jobStores(ctx)
	if err != nil {
		return JobInfo{}, err
	}
	j, _, err := store.Get(ctx, name)
	if err != nil {
		return JobInfo{}, err
	}
	state, err := st.State(ctx, j.Name)
	if err != nil {
		return JobInfo{}, err
	}
	return jobInfo(j, &state), nil
}

// Jobs returns every job, by name, rejected ones included: a definition the
// schedulers refuse, and a key of gantry_jobs whose value is not a job at
// all, have Status JobRejected and the Reason. The map holds the latter
// again, by key, with why.
func (c *Client) Jobs(ctx context.Context) ([]JobInfo, map[string]error, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, st, err := c.jobStores(ctx)
	if err != nil {
		return nil, nil, err
	}
	list, bad, err := store.List(ctx)
	if err != nil {
		return nil, nil, err
	}
	states, err := st.States(ctx)
	if err != nil {
		return nil, nil, err
	}
	infos := make([]JobInfo, 0, len(list)+len(bad))
	for _, j := range list {
		s := states[j.Name]
		infos = append(infos, jobInfo(j, &s))
	}
	for key, err := range bad {
		infos = append(infos, rejectedJob(key, err))
	}
	slices.SortFunc(infos, func(a, b JobInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos, bad, nil
}

// rejectedJob is the JobInfo of a key of gantry_jobs whose value is not a
// job at all.
func rejectedJob(key string, err error) JobInfo {
	return JobInfo{Job: Job{Name: key}, Status: JobRejected, Reason: err.Error(), Running: []string{}}
}

// NextFires previews the next n fires of job name from now, as the
// schedulers will plan them: planned times outside its windows passed
// over (and counted), jitter added. A paused job is previewed as if
// resumed.
func (c *Client) NextFires(ctx context.Context, name string, n int) ([]jobs.Fire, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.jobStore(ctx)
	if err != nil {
		return nil, err
	}
	j, _, err := store.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if j, err = jobs.Normalize(j); err != nil {
		return nil, err
	}
	spec, err := jobs.Compile(j)
	if err != nil {
		return nil, err
	}
	return spec.Fires(time.Now(), n), nil
}

// RemoveJob removes job name: it does not fire again.
func (c *Client) RemoveJob(ctx context.Context, name string) error {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.jobStore(ctx)
	if err != nil {
		return err
	}
	return store.Delete(ctx, name)
}

// PauseJob pauses job name: it does not fire on schedule until resumed
// (TriggerJob still fires it).
func (c *Client) PauseJob(ctx context.Context, name string) (JobInfo, error) {
	return c.setPaused(ctx, name, true)
}

// ResumeJob resumes a paused job.
func (c *Client) ResumeJob(ctx context.Context, name string) (JobInfo, error) {
	return c.setPaused(ctx, name, false)
}

func (c *Client) setPaused(ctx context.Context, name string, paused bool) (JobInfo, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.jobStore(ctx)
	if err != nil {
		return JobInfo{}, err
	}
	j, err := store.Modify(ctx, name, func(j *wire.Job) error {
		j.Paused = paused
		j.UpdatedAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return JobInfo{}, err
	}
	return jobInfo(j, nil), nil
}

// TriggerJob asks the leading scheduler (gantry.api.scheduler.trigger) to
// fire job name now, even when it is paused or outside its windows, and
// returns the run it started. A job whose unfinished run forbids another
// is ErrConflict, a job that does not exist ErrNotFound, no leading
// scheduler ErrUnavailable.
func (c *Client) TriggerJob(ctx context.Context, name string) (JobRun, error) {
	var run JobRun
	if err := c.request(ctx, wire.SubjectSchedulerTrigger, noScheduler, wire.TriggerRequest{Job: name}, &run); err != nil {
		return JobRun{}, fmt.Errorf("trigger %s: %w", name, err)
	}
	return run, nil
}

// JobRuns returns job name's latest runs, oldest first: at most limit (0:
// all kept).
func (c *Client) JobRuns(ctx context.Context, name string, limit int) ([]JobRun, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, st, err := c.jobStores(ctx)
	if err != nil {
		return nil, err
	}
	runs, err := st.Runs(ctx, name, limit)
	if err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		if _, _, err := store.Get(ctx, name); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

func (c *Client) jobStores(ctx context.Context) (*jobs.Store, *jobs.SchedulerStore, error) {
	store, err := c.jobStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := c.schedulerStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	return store, st, nil
}
