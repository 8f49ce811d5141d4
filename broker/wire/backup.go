package wire

import "time"

// EventLeaseRevoked records a lease a restore took away from its holder, on
// gantry.audit.resource.lease_revoked: leases from before a backup are not
// honoured after it is restored. Its payload has "owner", "expires_at" and
// "revision" (the lease's, in the backup). `gantry restore` publishes it;
// auditd stores it when the restored system first runs.
const EventLeaseRevoked EventType = "LEASE_REVOKED"

// BackupPayload is the payload of the built-in task type backup: take a
// whole-system backup (as `gantry backup`) into a new directory under Dir,
// named BackupDirPrefix and the UTC time, and then keep the newest Keep
// backups there.
type BackupPayload struct {
	// Dir is the directory the backups go under, on the worker's machine.
	// Required.
	Dir string `json:"dir"`
	// Keep is how many backups to keep in Dir, the new one included; older
	// ones are removed. Zero keeps every one.
	Keep int `json:"keep,omitempty"`
	// NoAudit leaves the audit store out (for a system without auditd).
	NoAudit bool `json:"no_audit,omitempty"`
}

// BackupDirPrefix starts the name of every directory a backup task writes
// under its BackupPayload.Dir: "gantry-backup-20261130T031200Z".
const BackupDirPrefix = "gantry-backup-"

// BackupManifestFile is the manifest at the top of a whole-system backup
// directory: a BackupManifest.
const BackupManifestFile = "gantry-backup.json"

// BackupFormat is the version of the backup layout BackupManifest
// describes.
const BackupFormat = 1

// BackupManifest describes a whole-system backup (`gantry backup DIR`):
// what was taken, when, from which server, and the size and SHA-256 of
// every file, which `gantry backup verify` and `gantry restore` check
// before anything else.
type BackupManifest struct {
	// Format is BackupFormat when the backup was taken.
	Format int `json:"format"`
	// GantryVersion and ServerVersion are the versions of the gantry that
	// took the backup and of the nats-server it was taken from.
	GantryVersion string `json:"gantry_version"`
	ServerVersion string `json:"server_version"`
	// ServerName names the server the backup was taken from.
	ServerName string `json:"server_name,omitempty"`
	// Started and Finished bound the backup. Each stream and the audit
	// store is consistent as of its own Time, in between.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// TaskID is the backup task that took it, if a task did.
	TaskID string `json:"task_id,omitempty"`
	// Streams are the streams (KV buckets included) in the order they were
	// taken, which is the order they are restored in.
	Streams []BackupStream `json:"streams"`
	// Audit is the audit store, unless it was left out.
	Audit *BackupAudit `json:"audit,omitempty"`
	// Files lists every file of the backup but this manifest.
	Files []BackupFile `json:"files"`
}

// BackupStream is one stream of a backup: a JetStream snapshot of its
// messages and consumers (Data, the server's archive as it sent it) and its
// configuration and state (Meta, the restore request).
type BackupStream struct {
	Name string `json:"name"`
	// Bucket is the KV bucket the stream holds, if it is one.
	Bucket string `json:"bucket,omitempty"`
	// Time is when the snapshot was asked for.
	Time      time.Time `json:"time"`
	Messages  uint64    `json:"messages"`
	Bytes     uint64    `json:"bytes"`
	FirstSeq  uint64    `json:"first_seq"`
	LastSeq   uint64    `json:"last_seq"`
	Consumers int       `json:"consumers"`
	// Data and Meta are paths of files in BackupManifest.Files.
	Data string `json:"data"`
	Meta string `json:"meta"`
}

// BackupAudit is the audit store of a backup: a Pebble checkpoint under
// Dir, as `gantry audit backup` takes it.
type BackupAudit struct {
	// Time is when auditd took the checkpoint.
	Time time.Time `json:"time"`
	// Dir is the directory of the store's files, relative to the backup.
	Dir string `json:"dir"`
}

// BackupFile is one file of a backup.
type BackupFile struct {
	// Path is the file's path relative to the backup directory, with '/'.
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}
