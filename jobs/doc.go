// Package jobs holds scheduled jobs and the scheduler's state on JetStream
// KV:
//
//   - Store (gantry_jobs): one wire.Job per job name, written by the config
//     file, 'gantry job add' or any NATS client and watched by every
//     scheduler;
//   - SchedulerStore (gantry_scheduler): the leader lease with its fencing
//     term, each job's last planned time, the run history and resource
//     cooldowns.
//
// Errors match the kv vocabulary: errors.Is(err, ErrNotFound) and
// errors.Is(err, kv.ErrNotFound) both hold for a missing job.
package jobs
