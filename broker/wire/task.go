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
	// type (see ExecPayload, NoopPayload, HTTPPayload, SQLPayload).
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

// SQLPayload is the payload of the built-in type sql: one statement (or,
// on SQL Server, a stored procedure) run against a database of the config
// file's databases. See docs/sql.md.
type SQLPayload struct {
	// DB names an entry of the config file's databases.
	DB string `json:"db"`
	// Statement is the SQL to run, with the driver's placeholders ($1 on
	// PostgreSQL, ? on SQLite and MySQL, @p1 or @name on SQL Server), or a
	// SQL Server stored procedure's bare name.
	Statement string `json:"statement"`
	// Args are bound as parameters, never spliced into Statement: a JSON
	// array for positional placeholders, or an object for named ones.
	Args json.RawMessage `json:"args,omitempty"`
	// Out names the output parameters of a SQL Server stored procedure;
	// their values are in the result. A name also in Args starts with
	// that value, whose JSON type gives the parameter's type.
	Out []string `json:"out,omitempty"`
	// Timeout is a Go duration bounding the statement, under the task's
	// own timeout; it cancels the statement on the server.
	Timeout string `json:"timeout,omitempty"`
	// Tx runs the statement in a transaction, committed when it succeeds.
	Tx bool `json:"tx,omitempty"`
	// MaxRows bounds the rows of a result set kept in the result. Defaults
	// to 100.
	MaxRows int `json:"max_rows,omitempty"`
}

// The drivers a database of the config file's databases can name.
const (
	DriverSQLite    = "sqlite"
	DriverPostgres  = "postgres"
	DriverSQLServer = "sqlserver"
	DriverMySQL     = "mysql"
)

// ValidDriver reports whether drv is one of the database drivers.
func ValidDriver(drv string) bool {
	switch drv {
	case DriverSQLite, DriverPostgres, DriverSQLServer, DriverMySQL:
		return true
	}
	return false
}

// SQLResult is the result of a sql task, kept on its record
// (TaskRecord.Result), in its TASK_FINISHED event and shown by `gantry
// task get`.
type SQLResult struct {
	// RowsAffected is set for a statement run for its effect (INSERT,
	// UPDATE, DELETE, MERGE, DDL), when the driver reports it.
	RowsAffected *int64 `json:"rows_affected,omitempty"`
	// Columns and Rows are the first result set of a statement that
	// returns rows: at most max_rows rows, bounded in size. Values are
	// JSON numbers, strings, booleans or null; times are RFC 3339 strings;
	// bytes that are not UTF-8 text are base64.
	Columns []string `json:"columns,omitempty"`
	Rows    [][]any  `json:"rows,omitempty"`
	// Truncated says rows were left out: there were more than max_rows,
	// or they were over the size bound.
	Truncated bool `json:"truncated,omitempty"`
	// Out holds the output parameters of a SQL Server procedure.
	Out map[string]any `json:"out,omitempty"`
	// ReturnStatus is a SQL Server procedure's return status.
	ReturnStatus *int64 `json:"return_status,omitempty"`
}

// Environment variables every exec'd process gets.
const (
	EnvTaskID   = "GANTRY_TASK_ID"
	EnvAttempt  = "GANTRY_ATTEMPT"
	EnvResource = "GANTRY_RESOURCE"
	// EnvLeaseRevision is the revision of the lease the process runs
	// under (an exec task with a resource, `gantry lease run`): a fencing
	// token, higher for every later holder of the resource, that the
	// process can pass to what it writes.
	EnvLeaseRevision = "GANTRY_LEASE_REVISION"
)
