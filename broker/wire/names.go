package wire

import (
	"fmt"
	"strings"
)

// Streams and buckets provisioned by the broker. Their names are part of the
// contract: users inspect them with `nats stream ls` and `nats kv ls`.
const (
	// StreamTasks holds every task message published on SubjectTasksAll.
	// Workers consume it; anyone may publish to it.
	StreamTasks = "GANTRY_TASKS"
	// StreamAudit holds every audit event published on SubjectAuditAll.
	// auditd consumes it into Pebble; `gantry audit tail` reads it live.
	StreamAudit = "GANTRY_AUDIT"

	// BucketLeases holds one key per leased resource, with a per-key TTL.
	BucketLeases = "gantry_leases"
	// BucketResources holds one Resource per key.
	BucketResources = "gantry_resources"
	// BucketRoutes holds one Route (egress route health) per key.
	BucketRoutes = "gantry_routes"
	// BucketJobs holds one scheduled job definition per key.
	BucketJobs = "gantry_jobs"
	// BucketTasks holds the latest TaskInfo of every task, keyed by task id.
	BucketTasks = "gantry_tasks"
	// BucketCheckpoints holds task checkpoints and operation keys.
	BucketCheckpoints = "gantry_checkpoints"
	// BucketScheduler holds scheduler state: the leader lease and last fire
	// times.
	BucketScheduler = "gantry_scheduler"
	// BucketWaiters holds the places in line of those waiting for a busy
	// resource: one Waiter per key <resource>.<ticket>, with a per-key TTL
	// that its waiter renews.
	BucketWaiters = "gantry_waiters"
)

// Buckets lists every KV bucket the broker provisions, in a stable order.
var Buckets = []string{
	BucketLeases, BucketResources, BucketRoutes, BucketJobs,
	BucketTasks, BucketCheckpoints, BucketScheduler, BucketWaiters,
	BucketQueues, BucketWorkers,
}

// Subjects. Each has a wildcard form for subscribers and a function that
// builds the concrete subject for publishers.
const (
	// SubjectTasksPrefix prefixes every task subject:
	// gantry.tasks.<queue>.<type>.
	SubjectTasksPrefix = "gantry.tasks"
	// SubjectTasksAll matches every task of every queue and type.
	SubjectTasksAll = SubjectTasksPrefix + ".>"

	// SubjectReadyPrefix prefixes the subjects a prioritized queue's sorter
	// moves tasks to, highest priority first: gantry.ready.<queue>.<type>.
	// They are in StreamTasks too; the queue's workers consume them.
	SubjectReadyPrefix = "gantry.ready"
	// SubjectReadyAll matches every sorted task.
	SubjectReadyAll = SubjectReadyPrefix + ".>"

	// SubjectReviewPrefix prefixes the subjects where the message of a task
	// in NEEDS_REVIEW is kept, in StreamTasks, until it is retried:
	// gantry.review.<task id>. No consumer reads them.
	SubjectReviewPrefix = "gantry.review"
	// SubjectReviewAll matches every kept message.
	SubjectReviewAll = SubjectReviewPrefix + ".>"

	// SubjectAuditPrefix prefixes every audit event subject:
	// gantry.audit.<kind>.<verb>.
	SubjectAuditPrefix = "gantry.audit"
	// SubjectAuditAll matches every audit event.
	SubjectAuditAll = SubjectAuditPrefix + ".>"

	// SubjectHandlersPrefix prefixes the request-reply subjects of task
	// handlers written outside gantry: gantry.handlers.<type>.
	SubjectHandlersPrefix = "gantry.handlers"

	// SubjectAuditQuery is the NATS service endpoint that answers audit
	// queries from the Pebble store.
	SubjectAuditQuery = "gantry.api.audit.query"

	// SubjectHealthPrefix prefixes route health results published by
	// healthd: gantry.health.route.<route id>.
	SubjectHealthPrefix = "gantry.health.route"
	// SubjectHealthAll matches every route health result.
	SubjectHealthAll = SubjectHealthPrefix + ".>"
)

// DefaultQueue is the queue of a task published without one.
const DefaultQueue = "default"

// TaskSubject returns the subject a task of type typ is published on in
// queue. An empty queue means DefaultQueue.
func TaskSubject(queue, typ string) string {
	if queue == "" {
		queue = DefaultQueue
	}
	return SubjectTasksPrefix + "." + queue + "." + typ
}

// ReadySubject returns the subject a prioritized queue's sorter moves a
// task of type typ to.
func ReadySubject(queue, typ string) string {
	return SubjectReadyPrefix + "." + queue + "." + typ
}

// ReviewSubject returns the subject the message of task id is kept on
// while the task is in NEEDS_REVIEW.
func ReviewSubject(id string) string { return SubjectReviewPrefix + "." + id }

// ParseTaskSubject splits gantry.tasks.<queue>.<type>, or the sorted
// gantry.ready.<queue>.<type>, into its queue and type.
func ParseTaskSubject(subject string) (queue, typ string, err error) {
	rest, ok := strings.CutPrefix(subject, SubjectTasksPrefix+".")
	if !ok {
		rest, ok = strings.CutPrefix(subject, SubjectReadyPrefix+".")
	}
	if !ok {
		return "", "", fmt.Errorf("subject %q is not a task subject (%s.<queue>.<type>)", subject, SubjectTasksPrefix)
	}
	queue, typ, ok = strings.Cut(rest, ".")
	if !ok || queue == "" || typ == "" || strings.Contains(typ, ".") {
		return "", "", fmt.Errorf("subject %q is not a task subject (%s.<queue>.<type>)", subject, SubjectTasksPrefix)
	}
	return queue, typ, nil
}

// HandlerSubject returns the request-reply subject of the external handler
// for task type typ.
func HandlerSubject(typ string) string { return SubjectHandlersPrefix + "." + typ }

// HealthSubject returns the subject healthd publishes route's probe results
// on.
func HealthSubject(route string) string { return SubjectHealthPrefix + "." + route }

// ValidToken reports whether s can stand as one token of a subject: a queue,
// a type, a resource or route id. It must be non-empty and free of
// whitespace, '.', '*' and '>'.
func ValidToken(s string) bool {
	if s == "" {
		return false
	}
	return !strings.ContainsAny(s, ".*> \t\r\n")
}
