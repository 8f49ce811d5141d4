package wire

import "time"

// SubjectOutputPrefix prefixes the subjects of tasks' live output:
// gantry.output.<task id>. Workers publish an exec task's stdout and stderr
// lines there while it runs (core NATS, not stored), redacted, bounded in
// rate and line length; `gantry task logs -f` and client.TaskLogs follow
// them.
const SubjectOutputPrefix = "gantry.output"

// SubjectOutputAll matches the live output of every task.
const SubjectOutputAll = SubjectOutputPrefix + ".>"

// OutputSubject returns the subject of task id's live output.
func OutputSubject(id string) string { return SubjectOutputPrefix + "." + id }

// The streams of an OutputLine.
const (
	// OutputStdout and OutputStderr are an exec'd process's.
	OutputStdout = "stdout"
	OutputStderr = "stderr"
	// OutputHandler is a line a remote handler sent in a progress message.
	OutputHandler = "handler"
	// OutputTail is a line of the output kept in the task's record (the
	// last attempt's tail), read once the attempt has ended.
	OutputTail = "tail"
)

// OutputLine is one line of a task's output: the body of a message on
// OutputSubject(task id), published by the worker running the task, and
// what client.TaskLogs yields.
type OutputLine struct {
	TaskID string `json:"task_id"`
	// Attempt is the attempt that printed the line (0 for a tail line).
	Attempt int `json:"attempt"`
	// Seq numbers the lines of one attempt from 1, stdout and stderr
	// together; a line dropped over the rate limit leaves a gap.
	Seq    uint64    `json:"seq"`
	Stream string    `json:"stream"`
	Time   time.Time `json:"time"`
	// Line is the text, without its line end, with secrets redacted.
	Line string `json:"line"`
	// Cut reports that the line was longer than the workers' bound and
	// its end was dropped.
	Cut bool `json:"cut,omitempty"`
	// Dropped counts the lines dropped over the rate limit just before
	// this one.
	Dropped int `json:"dropped,omitempty"`
}

// SubjectTaskOutput is the endpoint of the "gantry-workers" service that
// answers with the recent output lines of a running task: a
// TaskOutputRequest, delivered to every worker process; only the worker
// running the task answers, with a TaskOutputReply.
const SubjectTaskOutput = "gantry.control.task.output"

// TaskOutputRequest is the body of a request on SubjectTaskOutput.
type TaskOutputRequest struct {
	ID string `json:"id"`
}

// TaskOutputReply is the answer of the worker running a task: the last
// lines of its current attempt, oldest first, bounded like the record's
// output.
type TaskOutputReply struct {
	ID      string       `json:"id"`
	Attempt int          `json:"attempt"`
	Worker  string       `json:"worker,omitempty"`
	Lines   []OutputLine `json:"lines"`
}

// Headers of the request-reply with a remote handler on
// HandlerSubject(type), besides those of its reply.
const (
	// HeaderHeartbeatWindow on a handler request is a Go duration: once
	// the handler has sent a progress message (HeaderProgress), a silence
	// longer than this fails the attempt as lost, so a handler that died
	// is noticed within it. A handler that never sends one is waited for
	// until the task's deadline.
	HeaderHeartbeatWindow = "Gantry-Heartbeat-Window"
	// HeaderProgress marks a message a handler sends to the request's
	// reply subject before its final reply: a heartbeat. Its value is
	// free (a step, a percentage); its body, if any, is output lines.
	HeaderProgress = "Gantry-Progress"
)

// EventAttemptLost records, on the redelivery of a task, that earlier
// deliveries ended without an outcome: their worker stopped or died while
// the task ran. Its payload has "attempt" (the last attempt lost), "lost"
// (how many deliveries) and, when known, "worker" and "state".
const EventAttemptLost EventType = "ATTEMPT_LOST"

// The reasons a RETRY_SCHEDULED payload may carry in "reason".
const (
	// ReasonNoHandler: no handler answered on HandlerSubject(type).
	ReasonNoHandler = "no_handler"
	// ReasonHandlerSilent: a handler that sent progress heartbeats fell
	// silent for longer than the heartbeat window.
	ReasonHandlerSilent = "handler_silent"
)
