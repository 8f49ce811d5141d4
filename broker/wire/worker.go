package wire

import (
	"encoding/json"
	"strconv"
	"time"
)

// TaskRecord is the value of a task's key in BucketTasks: the contract's
// TaskInfo plus what workers need to resume, retry or cancel the task.
// Workers write it; `gantry submit` creates it for the tasks it publishes;
// `gantry task get|ls|retry|cancel` read and update it.
type TaskRecord struct {
	TaskInfo
	// Deliveries is the broker's delivery count of the task's current
	// message. Attempts is Deliveries minus Delays.
	Deliveries int `json:"deliveries,omitempty"`
	// Delays counts deliveries that did not run the task: not_before not
	// reached yet, a delayed retry (rate limit, busy resource, route
	// cooldown, a delay exit code). They do not use up max_attempts.
	Delays      int        `json:"delays,omitempty"`
	MaxAttempts int        `json:"max_attempts,omitempty"`
	Priority    int        `json:"priority,omitempty"`
	Key         string     `json:"key,omitempty"`
	NotBefore   *time.Time `json:"not_before,omitempty"`
	// RetryAt is when a task in RETRY_WAIT is delivered again.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// Seq is the stream sequence of the task's current message in
	// StreamTasks (0 when unknown).
	Seq uint64 `json:"seq,omitempty"`
	// Worker names the worker that last ran the task.
	Worker string `json:"worker,omitempty"`
	// Job names the job that fired the task (its message's HeaderJob),
	// if a job did; every event of the task carries it as job_id.
	Job string `json:"job,omitempty"`
	// Output holds the tail of the last attempt's output (exec: stdout and
	// stderr; http: the response body), bounded.
	Output string `json:"output,omitempty"`
	// Result is what the handler of a task that SUCCEEDED returned (sql:
	// a SQLResult), bounded; TASK_FINISHED carries it too.
	Result json.RawMessage `json:"result,omitempty"`
	// Kept is the subject of StreamTasks that keeps the task's message,
	// as published, while the task is in NEEDS_REVIEW (ReviewSubject of
	// its id), so that `gantry task retry` can publish it again. The
	// message is kept there before the record is written and removed from
	// its queue only after: a message of any size (up to the broker's
	// limit) has a record that fits.
	Kept string `json:"kept,omitempty"`
	// Message is the task's message as records written by earlier
	// releases kept it (now Kept); `gantry task retry` still reads it.
	Message *StoredMessage `json:"message,omitempty"`
	// Run numbers the task's runs: a task runs once when published, and
	// once more after each `gantry task retry`. Each run ends in exactly
	// one TASK_FINISHED, whose payload carries the run. Omitted (read as
	// 1) for the first run.
	Run int `json:"run,omitempty"`
}

// StoredMessage is a task message kept outside its queue: where Kept
// points, or in an earlier release's record.
type StoredMessage struct {
	Subject string              `json:"subject"`
	Header  map[string][]string `json:"header,omitempty"`
	Data    []byte              `json:"data,omitempty"`
}

// Checkpoint is what a running task saved of its progress, in
// BucketCheckpoints under CheckpointKey(task id). A handler saves it; on a
// redelivery it gets the last one back. exec tasks read and write it as the
// JSON file named by EnvCheckpointFile.
type Checkpoint struct {
	Stage    string           `json:"stage,omitempty"`
	LastItem string           `json:"last_item,omitempty"`
	Counts   map[string]int64 `json:"counts,omitempty"`
	// ResumeArgs are whatever the handler needs to resume.
	ResumeArgs json.RawMessage `json:"resume_args,omitempty"`
	// Lease is the resource lease the task held when it saved.
	Lease     string    `json:"lease,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// HandlerRequest is the body of a request workers send on
// HandlerSubject(type) for a task type with no built-in handler. The
// handler answers within the task's timeout; an empty reply without
// HeaderError means success.
type HandlerRequest struct {
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	Queue    string          `json:"queue"`
	Attempt  int             `json:"attempt"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	Resource string          `json:"resource,omitempty"`
	// Checkpoint is the task's last saved checkpoint, if any.
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// Deadline is when the worker stops waiting for the reply.
	Deadline time.Time `json:"deadline"`
}

// Headers of a handler's reply and of task messages.
const (
	// HeaderError on a handler's reply marks a failure; its value is the
	// error message.
	HeaderError = "Gantry-Error"
	// HeaderErrorClass classifies a failure: ErrorClassRetry (the default),
	// ErrorClassDelay or ErrorClassPermanent.
	HeaderErrorClass = "Gantry-Error-Class"
	// HeaderRetryAfter is a Go duration or whole seconds: when to try a
	// delayed failure again.
	HeaderRetryAfter = "Gantry-Retry-After"
	// HeaderCheckpoint on a handler's reply carries a Checkpoint (JSON) to
	// save.
	HeaderCheckpoint = "Gantry-Checkpoint"
	// HeaderCreated on a task message says its publisher has already
	// emitted TASK_CREATED (`gantry submit` does), so workers do not.
	HeaderCreated = "Gantry-Created"
	// HeaderTaskID on a sorted task message is the id the task got when it
	// was published (its body's id, its Nats-Msg-Id or one made from its
	// sequence), so it keeps it on gantry.ready.
	HeaderTaskID = "Gantry-Task-Id"
	// HeaderIntakeSeq on a sorted task message is the stream sequence the
	// task was first stored at, on gantry.tasks.
	HeaderIntakeSeq = "Gantry-Intake-Seq"
	// HeaderIntakeTime on a sorted task message is when the task was first
	// stored (RFC 3339, nanoseconds): its created_at.
	HeaderIntakeTime = "Gantry-Intake-Time"
	// HeaderRun on a task message numbers its run when it is not the
	// first: `gantry task retry` publishes run 2, then 3… (see
	// TaskRecord.Run).
	HeaderRun = "Gantry-Run"
	// HeaderNotKept marks the empty message on a NEEDS_REVIEW task's review
	// subject when its own message could not be kept (too large, or not in
	// a restored backup): every task in review has a message there.
	HeaderNotKept = "Gantry-Not-Kept"
)

// TaskRun returns the run a task message's headers number: HeaderRun, or
// 1 for a message without it (the first run).
func TaskRun(h map[string][]string) int {
	if v := h[HeaderRun]; len(v) > 0 {
		if n, err := strconv.Atoi(v[0]); err == nil && n > 1 {
			return n
		}
	}
	return 1
}

// The error classes of HeaderErrorClass.
const (
	ErrorClassRetry     = "retry"
	ErrorClassDelay     = "delay"
	ErrorClassPermanent = "permanent"
)

// SubjectTaskCancel is the endpoint of the "gantry-workers" service where
// `gantry task cancel` announces a cancelled task: a TaskCancelRequest,
// delivered to every worker process. Only the worker running the task (or
// the sorter holding it) answers, with a TaskCancelReply, and records the
// task's end; the others stay silent. The scheduler's overlap policy
// replace publishes here without waiting for an answer.
const SubjectTaskCancel = "gantry.control.task.cancel"

// WorkersServiceName is the micro service every worker process registers
// (`nats micro ls`): its endpoint is SubjectTaskCancel.
const WorkersServiceName = "gantry-workers"

// TaskCancelRequest is the body of a request on SubjectTaskCancel.
type TaskCancelRequest struct {
	ID string `json:"id"`
}

// The actions of a TaskCancelReply.
const (
	// CancelStopping: a worker is stopping the running task (an exec
	// task's whole process tree is killed).
	CancelStopping = "stopping"
	// CancelDropped: a prioritized queue's sorter dropped the task it
	// held.
	CancelDropped = "dropped"
)

// TaskCancelReply is the answer of the worker that records a cancelled
// task's end.
type TaskCancelReply struct {
	ID string `json:"id"`
	// Action is CancelStopping or CancelDropped.
	Action string `json:"action"`
	// Worker names the worker process that answered.
	Worker string `json:"worker,omitempty"`
}

// EnvCheckpointFile names, in an exec'd process's environment, a file that
// holds the task's last checkpoint (JSON, or empty) and that the process may
// overwrite with a new one.
const EnvCheckpointFile = "GANTRY_CHECKPOINT_FILE"

// MaxTaskIDLen bounds the length of a task id.
const MaxTaskIDLen = 128

// ValidTaskID reports whether id can name a task: 1 to MaxTaskIDLen letters,
// digits, '-', '_' or '='. Task ids are KV keys.
func ValidTaskID(id string) bool {
	if id == "" || len(id) > MaxTaskIDLen {
		return false
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '='
		if !ok {
			return false
		}
	}
	return true
}
