// Package workers runs tasks: durable pull consumers on the GANTRY_TASKS
// stream, one per queue (or per queue and type where a type has its own
// concurrency limit), each task run by a handler — built in (noop, exec,
// http, sql), registered in-process in Go, or answered over NATS
// request-reply on gantry.handlers.<type> by a handler written in any
// language.
//
// The broker is the source of truth: AckWait is the ack deadline, the
// consumer's BackOff spaces redeliveries after a worker dies, MaxAckPending
// bounds concurrency, and the delivery count gives the attempt number. A
// running task heartbeats (InProgress) every AckWait/3. Every delivery ends
// in an ack, a nak with a delay, or a term; the consumer's max-deliveries
// advisory moves a task nobody could finish to NEEDS_REVIEW.
//
// Errors are classified: retryable (exponential backoff with jitter,
// min(base·2^n, max)), delayed (after a hint, without using up the
// attempts), permanent (NEEDS_REVIEW at once). See docs/tasks.md.
package workers
