// Package tasks holds the typed stores of task state on JetStream KV:
//
//   - Store (gantry_tasks): one wire.TaskRecord per task id, the record any
//     machine reads with 'gantry task get'. Records of tasks that ended
//     SUCCEEDED or CANCELLED carry a per-message TTL (the retention); live
//     and NEEDS_REVIEW records never expire.
//   - CheckpointStore (gantry_checkpoints): a task's last checkpoint, its
//     operation keys (a step guarded by one runs once even when the task is
//     redelivered) and the dedupe keys of submitted tasks.
//   - NewMsg, the one builder of a task message (subject, body,
//     Nats-Msg-Id): the client's Submit and Retry and the scheduler's fires
//     all publish what it builds.
//
// Errors match the kv vocabulary: errors.Is(err, ErrNotFound) and
// errors.Is(err, kv.ErrNotFound) both hold for a missing task.
package tasks
