// Package auditd is the audit sink: a durable consumer on the GANTRY_AUDIT
// stream writes every event into a Pebble store, in batches committed with
// fsync, idempotent by event id, and acknowledges only what is durably
// written. A NATS micro service ("gantry-audit") answers queries on
// gantry.api.audit.query, takes online backups on gantry.api.audit.backup
// and reports counters on gantry.api.audit.stats, so any machine can ask.
// Retention removes events older than the configured age with range
// deletes.
//
// # Key layout
//
// Events are keyed by their UTC day and time; each set field adds one
// secondary index key, in the same batch:
//
//	d <day:4> e <time:8> <id>                 → the event (JSON)
//	x <kind> <value> 0x00 <time:8> <id>       → empty (secondary index)
//
// kind is one of k (task), r (resource), o (route), j (job), y (type) and
// l (level, all but info: an info query scans the events). The 0x00
// after the value keeps "task-1" from matching "task-10"; the time after it
// makes a time range one key range within each value, so a query is one
// range scan. Writing an event again puts the same keys over themselves, so
// ingest is idempotent without a read. Events come back oldest first; a
// cursor is the (time, id) of the last event of a page. Retention deletes
// the index keys of expired events one by one and the events themselves
// with one range delete.
package auditd
