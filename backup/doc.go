// Package backup takes and restores whole-system backups of gantry: every
// stream and KV bucket through JetStream's own snapshot and restore API
// (messages and consumer state), and the audit store through the Pebble
// checkpoint auditd makes, with a manifest holding the size and SHA-256 of
// every file. Everything travels over NATS, so a backup can be taken while
// the system runs, from any machine that reaches the broker.
//
// Take writes a backup into a directory; TakeUnder writes one under a
// parent directory and keeps the newest N (what the built-in task type
// backup runs, so that scheduled backups are a job); Verify checks a
// backup against its manifest; Verified.Restore brings it back on a fresh
// broker and settles what the restore made stale: leases are revoked,
// their resources reclaimed, the records of tasks that ended while the
// backup was taken parked for review. 'gantry backup', 'gantry backup
// verify' and 'gantry restore' are the commands; docs/operations.md says
// how to use them.
package backup
