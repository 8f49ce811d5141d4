package wire

import "time"

// Subjects of the audit store's NATS service (micro service "gantry-audit",
// listed by `nats micro ls`). auditd answers them; `gantry audit query` and
// `gantry audit backup` ask them, from any machine.
const (
	// SubjectAuditBackup asks auditd for an online backup of its store: an
	// AuditBackupRequest, answered by an AuditBackupReply.
	SubjectAuditBackup = "gantry.api.audit.backup"
	// SubjectAuditStats asks auditd for its counters: an empty request,
	// answered by AuditStats.
	SubjectAuditStats = "gantry.api.audit.stats"

	// AuditServiceName is the micro service auditd registers.
	AuditServiceName = "gantry-audit"

	// BucketAuditBackups is the object store auditd hands backups over in,
	// so a backup can be fetched from any machine. Objects expire after an
	// hour.
	BucketAuditBackups = "gantry_audit_backups"

	// AuditBackupManifest is the file a fetched backup carries next to the
	// store's files: the AuditBackupReply, with each file's size and
	// SHA-256.
	AuditBackupManifest = "gantry-audit-backup.json"
)

// EventAuditMalformed is the type of the record auditd stores in place of a
// message on the audit stream that is not a valid event. It is stored, not
// published; its payload has "subject", "stream_seq", "error" and "size".
const EventAuditMalformed EventType = "AUDIT_MALFORMED"

// AuditQuery is the request on SubjectAuditQuery. Every field is optional;
// set filters must all match. Events come oldest first.
type AuditQuery struct {
	TaskID     string    `json:"task_id,omitempty"`
	ResourceID string    `json:"resource_id,omitempty"`
	RouteID    string    `json:"route_id,omitempty"`
	JobID      string    `json:"job_id,omitempty"`
	Type       EventType `json:"type,omitempty"`
	Level      Level     `json:"level,omitempty"`
	// Since is the inclusive lower bound of the event time.
	Since *time.Time `json:"since,omitempty"`
	// Until is the exclusive upper bound of the event time.
	Until *time.Time `json:"until,omitempty"`
	// Limit caps the events of one page. Defaults to 100; at most 10000.
	Limit int `json:"limit,omitempty"`
	// Cursor continues a previous page: the Cursor of its AuditPage, sent
	// with the same filters.
	Cursor string `json:"cursor,omitempty"`
}

// Matches reports whether ev passes every field filter of q (its task,
// resource, route, job, type and level; not its time range), as auditd's
// query answers it. A live tail filters with it the same way.
func (q *AuditQuery) Matches(ev *Event) bool {
	return (q.TaskID == "" || ev.TaskID == q.TaskID) &&
		(q.ResourceID == "" || ev.ResourceID == q.ResourceID) &&
		(q.RouteID == "" || ev.RouteID == q.RouteID) &&
		(q.JobID == "" || ev.JobID == q.JobID) &&
		(q.Type == "" || ev.Type == q.Type) &&
		(q.Level == "" || ev.Level == q.Level)
}

// AuditPage is the reply on SubjectAuditQuery: one page of events, oldest
// first. Cursor is set when more events may match; send it back in
// AuditQuery.Cursor for the next page. A page can hold fewer events than
// the limit and still have a cursor when auditd stopped at its scan budget,
// or at its byte budget (a reply must fit the broker's message limit).
type AuditPage struct {
	Events []Event `json:"events"`
	Cursor string  `json:"cursor,omitempty"`
}

// AuditBackupRequest is the request on SubjectAuditBackup.
type AuditBackupRequest struct {
	// Name is a label for the backup, used in its object names. Defaults to
	// a ULID.
	Name string `json:"name,omitempty"`
}

// AuditBackupReply answers an AuditBackupRequest: auditd has taken a
// Pebble checkpoint and put each of its files into BucketAuditBackups as
// "<name>/<file>". The requester fetches them, checks the digests and
// deletes them.
type AuditBackupReply struct {
	Name  string            `json:"name"`
	Time  time.Time         `json:"time"`
	Files []AuditBackupFile `json:"files"`
}

// AuditBackupFile is one file of an audit store backup.
type AuditBackupFile struct {
	// Path is the file's path inside the backup directory.
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// AuditStats is the reply on SubjectAuditStats: what auditd has done since
// it started.
type AuditStats struct {
	// Stored counts events written into the store. A redelivered event is
	// written again over itself, so it counts again but is stored once.
	Stored uint64 `json:"stored"`
	// Malformed counts messages that were not valid events: stored as
	// AUDIT_MALFORMED records, acknowledged and skipped.
	Malformed uint64 `json:"malformed"`
	// WriteErrors counts failed store writes; each was retried.
	WriteErrors uint64 `json:"write_errors"`
	// Expired counts events removed by retention.
	Expired uint64 `json:"expired"`
	// Retention is the configured retention (Go duration; "0s" keeps
	// everything).
	Retention string `json:"retention"`
}
