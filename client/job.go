package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/jobs"
)

// noScheduler says what to start when no scheduler leads.
const noScheduler = "no scheduler leads: start 'gantry run' or 'gantry scheduler'"

// JobInfo is a job with its next fire and what the leading scheduler last
// did with it.
type JobInfo struct {
	Job
	// NextFire is the next planned fire; nil for a paused job or one that
	// will not fire again.
	NextFire *time.Time `json:"next_fire"`
	// LastFired is when the job last fired.
	LastFired *time.Time `json:"last_fired"`
	// Running are the ids of the job's fired tasks not yet finished.
	Running []string `json:"running"`
}

// jobInfo returns j with its next fire, and with what st says when st is
// not nil.
func jobInfo(j Job, st *wire.JobState) JobInfo {
	info := JobInfo{Job: j, Running: []string{}}
	if !j.Paused {
		if next, err := jobs.NextFire(j, time.Now()); err == nil && !next.IsZero() {
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

// Jobs returns every job, by name, and the keys of gantry_jobs whose value
// is not a valid job, with why (the schedulers skip them).
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
	infos := make([]JobInfo, 0, len(list))
	for _, j := range list {
		s := states[j.Name]
		infos = append(infos, jobInfo(j, &s))
	}
	return infos, bad, nil
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
