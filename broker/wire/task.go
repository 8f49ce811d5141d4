package wire

import (
	"encoding/json"
	"time"
)

// Task is the body of a message on gantry.tasks.<queue>.<type>. Anyone may
// publish one (`gantry submit`, the scheduler, `nats pub`, any NATS client);
// workers consume it. Every field is optional: a task's type and queue come
// from its subject.
type Task struct {
	// ID names the task. Defaults to the message's Nats-Msg-Id, then to a
	// new ULID assigned by the worker that first sees it.
	ID string `json:"id,omitempty"`
	// Payload is the input of the task's handler; its shape depends on the
	// type (see ExecPayload, NoopPayload, HTTPPayload).
	Payload json.RawMessage `json:"payload,omitempty"`
	// Resource, when set, is leased before the task runs and released after.
	Resource string `json:"resource,omitempty"`
	// Priority orders tasks of the same queue; higher runs first.
	Priority int `json:"priority,omitempty"`
	// MaxAttempts bounds the deliveries of this task before it goes to
	// NEEDS_REVIEW. Zero means the queue's default.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Timeout is a Go duration string ("30s") bounding one attempt.
	Timeout string `json:"timeout,omitempty"`
	// NotBefore delays the first attempt until this time (RFC 3339).
	NotBefore *time.Time `json:"not_before,omitempty"`
	// Key deduplicates: two tasks with the same key run once. The
	// Nats-Msg-Id header does the same.
	Key string `json:"key,omitempty"`
}

// TaskState is where a task is in its life.
type TaskState string

// The task states of the contract.
const (
	TaskWaiting     TaskState = "WAITING"
	TaskRunning     TaskState = "RUNNING"
	TaskRetryWait   TaskState = "RETRY_WAIT"
	TaskSucceeded   TaskState = "SUCCEEDED"
	TaskNeedsReview TaskState = "NEEDS_REVIEW"
	TaskCancelled   TaskState = "CANCELLED"
)

// Terminal reports whether no further attempt follows state without an
// operator's action.
func (s TaskState) Terminal() bool {
	return s == TaskSucceeded || s == TaskNeedsReview || s == TaskCancelled
}

// TaskInfo is what gantry knows of one task: the value of its key in
// BucketTasks, written by workers and read by `gantry task get|ls`.
type TaskInfo struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	Queue     string    `json:"queue"`
	State     TaskState `json:"state"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	Resource  string    `json:"resource,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// NoopPayload is the payload of the built-in type noop.
type NoopPayload struct {
	// Sleep is a Go duration to wait before succeeding.
	Sleep string `json:"sleep,omitempty"`
}

// ExecPayload is the payload of the built-in type exec.
type ExecPayload struct {
	Cmd            []string          `json:"cmd"`
	Dir            string            `json:"dir,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	FailExitCodes  []int             `json:"fail_exit_codes,omitempty"`
	DelayExitCodes []int             `json:"delay_exit_codes,omitempty"`
}

// HTTPPayload is the payload of the built-in type http.
type HTTPPayload struct {
	Method  string            `json:"method,omitempty"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
	// Route names the egress route to go out through, or "auto" for the
	// best-scoring available one. Empty means a direct request.
	Route string `json:"route,omitempty"`
}

// Environment variables every exec'd process gets.
const (
	EnvTaskID   = "GANTRY_TASK_ID"
	EnvAttempt  = "GANTRY_ATTEMPT"
	EnvResource = "GANTRY_RESOURCE"
)
