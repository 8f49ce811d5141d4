package config

import (
	"encoding/json"
	"fmt"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/jobs"
)

// Definition returns the job as the one job definition, normalized
// (defaults filled) and checked by jobs.Normalize; its Source is
// wire.JobSourceConfig. An error matches jobs.ErrInvalid.
func (j Job) Definition() (wire.Job, error) {
	def := wire.Job{
		Name: j.Name, Type: j.Type, Queue: j.Queue, Priority: j.Priority, Timeout: j.Timeout,
		MaxAttempts: j.MaxAttempts, Resource: j.Resource, Description: j.Description,
		Cron: j.Cron, Every: j.Every, Timezone: j.Timezone, Windows: j.Windows, Jitter: j.Jitter,
		Misfire: wire.MisfirePolicy(j.Misfire), MisfireCap: j.MisfireCap, Overlap: wire.OverlapPolicy(j.Overlap),
		MaxPerHour: j.MaxPerHour, Cooldown: j.Cooldown, Paused: j.Paused, Source: wire.JobSourceConfig,
	}
	if j.Window != "" {
		def.Windows = append([]string{j.Window}, j.Windows...)
	}
	if j.Payload != nil {
		p, err := json.Marshal(j.Payload)
		if err != nil {
			return wire.Job{}, fmt.Errorf("%w %q: payload: %v", jobs.ErrInvalid, j.Name, err)
		}
		def.Payload = p
	}
	if j.At != "" {
		at, err := jobs.ParseAt(j.At, j.Timezone)
		if err != nil {
			return wire.Job{}, err
		}
		def.At = &at
	}
	return jobs.Normalize(def)
}

// JobDefinitions returns every job of the file as a job definition (see
// Job.Definition).
func (f *File) JobDefinitions() ([]wire.Job, error) {
	defs := make([]wire.Job, 0, len(f.Jobs))
	for i, j := range f.Jobs {
		def, err := j.Definition()
		if err != nil {
			return nil, fmt.Errorf("%w: jobs[%d]: %w", ErrInvalid, i, err)
		}
		defs = append(defs, def)
	}
	return defs, nil
}
