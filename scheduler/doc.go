// Package scheduler fires gantry's scheduled jobs as tasks.
//
// Jobs live in the gantry_jobs bucket (wire.Job) and every scheduler
// watches it, so an add, edit, pause or delete takes effect at once; right
// before each batch of fires the leader asks the broker for any message of
// the bucket after the last one it has seen and applies every change up to
// it, so it never fires from a stale copy.
//
// Any number of schedulers may run. One leads, through a lease in
// gantry_scheduler: a key created with a per-key TTL and renewed by
// compare-and-swap every third of the TTL, carrying a fencing term that
// grows with every election. Before each batch the leader reads the key and
// fires only if it still holds its term. Every fire is published on
// gantry.tasks.<queue>.<type> with Nats-Msg-Id (and task id)
// "<job>-<planned unix seconds>", so a fire repeated by a new leader after
// a failover is dropped by the broker's dedupe window.
//
// Triggers (package jobs compiles them): cron (seconds optional, time zone), every
// (aligned to the Unix epoch) and at (one-shot). Policies: time windows,
// deterministic jitter, priority, max fires per hour, overlap
// allow/forbid/replace (learned from the task's audit events and
// gantry_tasks), per-resource cooldown, global and per-type concurrency caps
// (counted by the broker in the tasks stream) and misfire skip/once/all
// after downtime, counted from the last planned time the leader persists.
// Every fire, skip and miss is an audit event; each fire is a wire.JobRun
// in the run history.
package scheduler
