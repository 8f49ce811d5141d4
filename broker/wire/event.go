package wire

import (
	"encoding/json"
	"time"
)

// Event is an audit event: the body of a message on
// gantry.audit.<kind>.<verb>. Every component publishes them (through
// internal/audit, which fills ID, Time, Component and Host and redacts
// secrets); auditd stores them, `gantry audit tail` and `nats sub
// 'gantry.audit.>'` follow them live.
type Event struct {
	// ID is a ULID: unique, and sorting by it sorts by time.
	ID string `json:"id"`
	// Time is when the event happened (RFC 3339 with nanoseconds).
	Time      time.Time `json:"time"`
	Type      EventType `json:"type"`
	Level     Level     `json:"level"`
	Component string    `json:"component"`
	Host      string    `json:"host"`

	TaskID     string `json:"task_id,omitempty"`
	ResourceID string `json:"resource_id,omitempty"`
	RouteID    string `json:"route_id,omitempty"`
	JobID      string `json:"job_id,omitempty"`

	Message string `json:"message,omitempty"`
	// Payload carries type-specific details; TASK_FINISHED has "state" and
	// "attempts".
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Level grades an event.
type Level string

// The event levels.
const (
	LevelDebug Level = "debug"
	LevelInfo  Level = "info"
	LevelWarn  Level = "warn"
	LevelError Level = "error"
)

// EventType names what happened.
type EventType string

// The event types. Each maps to one subject (see EventType.Subject).
const (
	EventTaskCreated    EventType = "TASK_CREATED"
	EventTaskStarted    EventType = "TASK_STARTED"
	EventRetryScheduled EventType = "RETRY_SCHEDULED"
	EventNeedsReview    EventType = "NEEDS_REVIEW"
	EventTaskFinished   EventType = "TASK_FINISHED"
	EventTaskRejected   EventType = "TASK_REJECTED"
	EventTaskCancelled  EventType = "TASK_CANCELLED"

	EventResourceLeased       EventType = "RESOURCE_LEASED"
	EventResourceReleased     EventType = "RESOURCE_RELEASED"
	EventLeaseConflict        EventType = "LEASE_CONFLICT"
	EventLeaseExpired         EventType = "LEASE_EXPIRED"
	EventResourceStateChanged EventType = "RESOURCE_STATE_CHANGED"

	EventRouteCooldown  EventType = "ROUTE_COOLDOWN"
	EventRouteRecovered EventType = "ROUTE_RECOVERED"

	EventJobFired      EventType = "JOB_FIRED"
	EventJobMissed     EventType = "JOB_MISSED"
	EventJobSkipped    EventType = "JOB_SKIPPED"
	EventLeaderElected EventType = "LEADER_ELECTED"

	EventConfigRejected EventType = "CONFIG_REJECTED"

	// EventValueQuarantined records a value in a bucket that a component
	// could not use (not the JSON it should be, a lease without the
	// broker's TTL, a term that is not a number) and what it did with it.
	// Its payload has "bucket", "key", "revision", "reason" and "action".
	EventValueQuarantined EventType = "VALUE_QUARANTINED"
)

// eventSubjects maps each event type to its <kind>.<verb>.
var eventSubjects = map[EventType]string{
	EventTaskCreated:    "task.created",
	EventTaskStarted:    "task.started",
	EventRetryScheduled: "task.retry_scheduled",
	EventNeedsReview:    "task.needs_review",
	EventTaskFinished:   "task.finished",
	EventTaskRejected:   "task.rejected",
	EventTaskCancelled:  "task.cancelled",
	EventAttemptLost:    "task.attempt_lost",

	EventResourceLeased:       "resource.leased",
	EventResourceReleased:     "resource.released",
	EventLeaseConflict:        "resource.lease_conflict",
	EventLeaseExpired:         "resource.lease_expired",
	EventResourceStateChanged: "resource.state_changed",
	EventResourceMoveRefused:  "resource.move_refused",
	EventResourceWaiting:      "resource.waiting",
	EventLeaseRevoked:         "resource.lease_revoked",

	EventRouteCooldown:  "route.cooldown",
	EventRouteRecovered: "route.recovered",

	EventJobFired:      "job.fired",
	EventJobMissed:     "job.missed",
	EventJobSkipped:    "job.skipped",
	EventLeaderElected: "scheduler.leader_elected",

	EventConfigRejected: "config.rejected",

	EventQueuePaused:  "queue.paused",
	EventQueueResumed: "queue.resumed",
	EventTaskPurged:   "task.purged",

	EventDashboardAction: "dashboard.action",

	EventAlertNeedsReview:   "alert.needs_review",
	EventAlertLongRunning:   "alert.long_running",
	EventAlertRouteDown:     "alert.route_down",
	EventAlertResourceFault: "alert.resource_fault",
	EventAlertLeaderLost:    "alert.leader_lost",
	EventAlertAuditLag:      "alert.audit_lag",
	EventValueQuarantined:   "kv.value_quarantined",
}

// EventTypes lists every known event type.
func EventTypes() []EventType {
	out := make([]EventType, 0, len(eventSubjects))
	for t := range eventSubjects {
		out = append(out, t)
	}
	return out
}

// Subject returns the subject events of type t are published on. An unknown
// type goes to gantry.audit.other.<type in lower case>, so nothing is lost.
func (t EventType) Subject() string {
	if kv, ok := eventSubjects[t]; ok {
		return SubjectAuditPrefix + "." + kv
	}
	return SubjectAuditPrefix + ".other." + lowerToken(string(t))
}

// Known reports whether t is one of the declared event types.
func (t EventType) Known() bool {
	_, ok := eventSubjects[t]
	return ok
}

func lowerToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c == '.' || c == '*' || c == '>' || c == ' ':
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "unknown"
	}
	return string(b)
}
