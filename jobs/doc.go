// Package jobs is the one definition of a scheduled job (wire.Job): one
// validator (Validate, Normalize, Compile: the config file, 'gantry job
// add', the scheduler and any Go client use it), the compiled Spec a
// scheduler plans with (cron through a maintained parser, every, at,
// windows, jitter), Apply (create or update, keeping an operator's pause),
// and the stores on JetStream KV:
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
