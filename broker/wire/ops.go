package wire

import (
	"encoding/json"
	"time"
)

// Buckets of operating gantry: queue pauses and live workers. The broker
// provisions them.
const (
	// BucketQueues holds one QueueState per paused (or once paused) queue,
	// keyed by the queue's name. `gantry queue pause|resume` write it;
	// every worker watches it.
	BucketQueues = "gantry_queues"
	// BucketWorkers holds one WorkerInfo per live worker process, keyed by
	// WorkerKey(name), each with a per-key TTL: a worker rewrites its key
	// every heartbeat; a killed one's key expires. `gantry worker ls`
	// reads it.
	BucketWorkers = "gantry_workers"
)

// The event types of operating gantry.
const (
	// EventQueuePaused: an operator paused a queue; its waiting tasks stay
	// in the stream until it is resumed.
	EventQueuePaused EventType = "QUEUE_PAUSED"
	// EventQueueResumed: an operator resumed a paused queue.
	EventQueueResumed EventType = "QUEUE_RESUMED"
	// EventTaskPurged: an operator removed an ended task's record
	// (`gantry task purge`); its events stay in the audit store.
	EventTaskPurged EventType = "TASK_PURGED"
)

// The alert event types, published by alertd on gantry.audit.alert.<kind>
// when a rule of the config file's alerts section fires. The payload is an
// Alert.
const (
	EventAlertNeedsReview   EventType = "ALERT_NEEDS_REVIEW"
	EventAlertLongRunning   EventType = "ALERT_LONG_RUNNING"
	EventAlertRouteDown     EventType = "ALERT_ROUTE_DOWN"
	EventAlertResourceFault EventType = "ALERT_RESOURCE_FAULT"
	EventAlertLeaderLost    EventType = "ALERT_LEADER_LOST"
	EventAlertAuditLag      EventType = "ALERT_AUDIT_LAG"
)

// AuditConsumer is the durable consumer auditd reads the audit stream
// with: its pending messages are auditd's lag.
const AuditConsumer = "auditd"

// SubjectAlertAll matches every alert event.
const SubjectAlertAll = SubjectAuditPrefix + ".alert.>"

// QueueState is the value of a queue's key in BucketQueues.
type QueueState struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
	// Reason is what the operator gave.
	Reason string `json:"reason,omitempty"`
	// By names who paused or resumed it (the CLI's host and user).
	By        string    `json:"by,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// WorkerInfo is the value of a live worker's key in BucketWorkers, written
// by the worker process every heartbeat.
type WorkerInfo struct {
	// Name is the worker's name, as in task records and leases.
	Name    string   `json:"name"`
	Host    string   `json:"host"`
	PID     int      `json:"pid"`
	Version string   `json:"version,omitempty"`
	Queues  []string `json:"queues"`
	// Running counts the tasks running now; Tasks lists them, oldest
	// first, at most MaxListedTasks.
	Running   int           `json:"running"`
	Tasks     []RunningTask `json:"tasks,omitempty"`
	StartedAt time.Time     `json:"started_at"`
	// Heartbeat is when the value was written; the key expires TTL after
	// it unless written again.
	Heartbeat time.Time `json:"heartbeat"`
	// TTL is how long the key lives without a heartbeat (Go duration).
	TTL string `json:"ttl"`
	// Window holds, per queue, what the worker did over the last hour (or
	// since it started, when that is later): the source of `gantry stats`'
	// per-queue throughput and percentiles.
	Window []QueueWindow `json:"window,omitempty"`
}

// MaxListedTasks bounds WorkerInfo.Tasks.
const MaxListedTasks = 100

// RunningTask is one task a worker runs.
type RunningTask struct {
	ID        string    `json:"id"`
	Queue     string    `json:"queue"`
	Type      string    `json:"type"`
	Attempt   int       `json:"attempt"`
	Resource  string    `json:"resource,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// QueueWindow is what one worker does with one queue's tasks: what runs
// now, and what it did over a window ending at the heartbeat (Since is
// its start).
type QueueWindow struct {
	Queue string    `json:"queue"`
	Since time.Time `json:"since"`
	// Running counts the queue's tasks running in the worker now.
	Running int `json:"running"`
	// Succeeded, NeedsReview and Cancelled count the tasks that ended so.
	Succeeded   uint64 `json:"succeeded"`
	NeedsReview uint64 `json:"needs_review"`
	Cancelled   uint64 `json:"cancelled"`
	// Retries counts the retries and delays scheduled.
	Retries uint64 `json:"retries"`
	// Wait and Run are histograms of the time tasks waited before an
	// attempt started and of the attempts' run times.
	Wait Histogram `json:"wait"`
	Run  Histogram `json:"run"`
}

// Histogram is a cumulative histogram: Counts[i] observations were at most
// Bounds[i] seconds; Count is every observation (those above the last
// bound included) and Sum their total in seconds.
type Histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum"`
}

// WorkerKey is the key of worker name in BucketWorkers: the name with every
// character a KV key cannot hold replaced by '_'.
func WorkerKey(name string) string {
	b := []byte(name)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '='
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// Alert is the payload of an alert event: what fired and why.
type Alert struct {
	// Rule names the rule of the config file; Kind is its kind
	// (needs_review, long_running, route_down, resource_fault,
	// leader_lost, audit_lag).
	Rule string `json:"rule"`
	Kind string `json:"kind"`
	// Summary is one line for a mail subject or a chat message.
	Summary string `json:"summary"`
	// Subject names what the alert is about: a task type, a route, a
	// resource, "scheduler" or "auditd".
	Subject string `json:"subject"`
	// Count is how many occurrences this alert stands for: those of its
	// window that were held back by the rule's rate limit included.
	Count int `json:"count"`
	// Since is the first occurrence it stands for.
	Since time.Time `json:"since"`
	// TaskID, Queue, Type and LastError describe the (latest) task
	// concerned, for task alerts.
	TaskID    string `json:"task_id,omitempty"`
	Queue     string `json:"queue,omitempty"`
	Type      string `json:"type,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Details holds what else the rule knows (a route's score, a lag).
	Details json.RawMessage `json:"details,omitempty"`
}
