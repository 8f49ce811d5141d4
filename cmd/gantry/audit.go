package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gantry-dev/gantry/auditd"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

func (a *app) auditCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Query, follow and back up the audit trail",
		Long: `Every state change in gantry is an audit event on gantry.audit.<kind>.<verb>.
auditd stores them in a Pebble store; these commands read it through the NATS
service gantry.api.audit.*, so they work from any machine that reaches the
broker.`,
	}
	cmd.AddCommand(a.auditQueryCommand(), a.auditTailCommand(), a.auditBackupCommand())
	return cmd
}

// auditFilters are the filter flags shared by query and tail.
type auditFilters struct {
	task, resource, route, job, typ, level string
}

func (f *auditFilters) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.task, "task", "", "only events of this task id")
	fs.StringVar(&f.resource, "resource", "", "only events of this resource id")
	fs.StringVar(&f.route, "route", "", "only events of this egress route id")
	fs.StringVar(&f.job, "job", "", "only events of this job")
	fs.StringVar(&f.typ, "type", "", "only events of this type (TASK_FINISHED, lease_conflict, …; any case)")
	fs.StringVar(&f.level, "level", "", "only events of this level: debug, info, warn or error")
}

// query checks the filters and returns them as a query.
func (f *auditFilters) query() (wire.AuditQuery, error) {
	q := wire.AuditQuery{TaskID: f.task, ResourceID: f.resource, RouteID: f.route, JobID: f.job}
	if f.typ != "" {
		t := wire.EventType(strings.ToUpper(f.typ))
		if !validEventType(t) {
			known := make([]string, 0, len(wire.EventTypes()))
			for _, k := range wire.EventTypes() {
				known = append(known, string(k))
			}
			slices.Sort(known)
			return q, usageError("--type %q: an event type is a word of letters, digits and '_' (%s, …)", f.typ, strings.Join(known, ", "))
		}
		q.Type = t
	}
	if f.level != "" {
		l := wire.Level(strings.ToLower(f.level))
		if !slices.Contains([]wire.Level{wire.LevelDebug, wire.LevelInfo, wire.LevelWarn, wire.LevelError}, l) {
			return q, usageError("--level %q: want debug, info, warn or error", f.level)
		}
		q.Level = l
	}
	return q, nil
}

// validEventType reports whether t can be an event type: letters, digits
// and '_', starting with a letter. Components may declare types beyond
// wire.EventTypes (they publish them under gantry.audit.other.<type>), so
// an unlisted type is not an error.
func validEventType(t wire.EventType) bool {
	for i, c := range t {
		if !(c >= 'A' && c <= 'Z' || i > 0 && (c >= '0' && c <= '9' || c == '_')) {
			return false
		}
	}
	return t != ""
}

// parseWhen reads a point in time: RFC 3339 (2026-11-30T03:12:00Z), a
// local date and time (2026-11-30 03:12, 2026-11-30), or a duration before
// now (90m, 2d).
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	var d retentionValue
	if err := d.Set(s); err == nil {
		return now.Add(-time.Duration(d)), nil
	}
	return time.Time{}, usageError("%s %q: want a time (2026-11-30T03:12:00Z, 2026-11-30 03:12) or a duration before now (90m, 2d)", flag, s)
}

func (a *app) auditQueryCommand() *cobra.Command {
	var (
		f            auditFilters
		since, until string
		limit        int
		cursor       string
		all          bool
	)
	cmd := &cobra.Command{
		Use:   "query",
		Short: "Query the audit store (through gantry.api.audit.query)",
		Long: `Query prints stored audit events, oldest first, that match every filter
given. A page holds --limit events (auditd answers in parts of under 1 MiB,
which the command puts together); when more match, the command prints the
cursor for the next page (--cursor), or follows every page with --all.
With --json it prints one document: {"events": [...], "cursor": "..."}.`,
		Example: `  gantry audit query --task 4711
  gantry audit query --resource cam1 --since "2026-11-30 03:00" --until "2026-11-30 03:30"
  gantry audit query --type lease_conflict --since 24h --json`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := f.query()
			if err != nil {
				return err
			}
			now := time.Now()
			if since != "" {
				t, err := parseWhen("--since", since, now)
				if err != nil {
					return err
				}
				q.Since = &t
			}
			if until != "" {
				t, err := parseWhen("--until", until, now)
				if err != nil {
					return err
				}
				q.Until = &t
			}
			if limit < 1 || limit > auditd.MaxLimit {
				return usageError("--limit %d: want 1 to %d", limit, auditd.MaxLimit)
			}
			q.Limit, q.Cursor = limit, cursor
			return a.auditQuery(cmd.Context(), q, all)
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().StringVar(&since, "since", "", "only events at or after this time (RFC 3339, local '2026-11-30 03:12', or a duration ago: 90m, 2d)")
	cmd.Flags().StringVar(&until, "until", "", "only events before this time (same forms as --since)")
	cmd.Flags().IntVar(&limit, "limit", auditd.DefaultLimit, "events per page")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue after the page that printed this cursor (same filters)")
	cmd.Flags().BoolVar(&all, "all", false, "follow the cursor and print every matching event")
	return cmd
}

func (a *app) auditQuery(ctx context.Context, q wire.AuditQuery, all bool) error {
	return a.withClient(ctx, "gantry-audit-query", func(c *client.Client) error {
		// auditd cuts a page short to keep its reply within the broker's
		// message limit: without --all, the pages are followed until
		// --limit events are in.
		var out wire.AuditPage
		limit := q.Limit
		for {
			page, err := c.QueryAudit(ctx, q)
			if err != nil {
				return err
			}
			out.Events = append(out.Events, page.Events...)
			out.Cursor = page.Cursor
			if page.Cursor == "" || !all && len(out.Events) >= limit {
				break
			}
			q.Cursor = page.Cursor
			if !all {
				q.Limit = limit - len(out.Events)
			}
		}
		if out.Events == nil {
			out.Events = []wire.Event{}
		}
		if a.json {
			return a.printJSON(out)
		}
		rows := make([][]string, 0, len(out.Events))
		for _, ev := range out.Events {
			rows = append(rows, eventRow(&ev))
		}
		if err := a.printTable(eventHeader, rows); err != nil {
			return err
		}
		if out.Cursor != "" {
			fmt.Fprintf(a.stderr, "more events match: add --cursor %s (or --all)\n", out.Cursor)
		}
		return nil
	})
}

var eventHeader = []string{"TIME", "TYPE", "LEVEL", "HOST", "TASK", "RESOURCE", "ROUTE", "JOB", "MESSAGE"}

// eventWidths are the starting widths of a tail's columns: wide enough
// for a local time with its offset, the longest event type, a ULID.
var eventWidths = []int{len(eventTimeLayout), len(wire.EventResourceStateChanged), 5, 16, 26, 12, 12, 16}

const eventTimeLayout = "2006-01-02T15:04:05.000Z07:00"

func eventRow(ev *wire.Event) []string {
	return []string{
		ev.Time.Local().Format(eventTimeLayout), string(ev.Type), string(ev.Level), dash(ev.Host),
		dash(ev.TaskID), dash(ev.ResourceID), dash(ev.RouteID), dash(ev.JobID), ev.Message,
	}
}

func (a *app) auditTailCommand() *cobra.Command {
	var (
		f     auditFilters
		since string
		count int
	)
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow audit events live as they are published",
		Long: `Tail prints audit events as they are published on gantry.audit.>, from now
on (or from --since, as far back as the GANTRY_AUDIT stream keeps them), until
interrupted or --count events have been printed. It reads the stream with an
ordered consumer and needs no auditd. With --json it prints one JSON object a
line.`,
		Example: `  gantry audit tail --resource cam1
  gantry audit tail --type task_finished --json | jq .payload`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := f.query()
			if err != nil {
				return err
			}
			var start time.Time
			if since != "" {
				t, err := parseWhen("--since", since, time.Now())
				if err != nil {
					return err
				}
				start = t
			}
			if count < 0 {
				return usageError("--count %d: want 0 (no limit) or more", count)
			}
			return a.auditTail(cmd.Context(), q, start, count)
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().StringVar(&since, "since", "", "start with the events published since this time (same forms as 'audit query --since')")
	cmd.Flags().IntVar(&count, "count", 0, "exit after printing this many events (0: follow until interrupted)")
	return cmd
}

func (a *app) auditTail(ctx context.Context, q wire.AuditQuery, since time.Time, count int) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.withClient(ctx, "gantry-audit-tail", func(c *client.Client) error {
		var table *streamTable
		if !a.json {
			var err error
			if table, err = newStreamTable(a.stdout, eventHeader, eventWidths); err != nil {
				return err
			}
		}
		printed := 0
		for ev, err := range c.TailAudit(ctx, q, since) {
			if errors.Is(err, client.ErrMalformedEvent) {
				fmt.Fprintf(a.stderr, "skipping %v\n", err)
				continue
			}
			if err != nil {
				return err
			}
			if a.json {
				err = a.printJSONLine(ev)
			} else {
				err = table.row(eventRow(&ev))
			}
			if err != nil {
				return err
			}
			if printed++; count > 0 && printed >= count {
				return nil
			}
		}
		return nil
	})
}

func (a *app) auditBackupCommand() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "backup DIR",
		Short: "Take an online backup of the audit store into DIR",
		Long: `Backup asks auditd (through gantry.api.audit.backup) for a consistent online
checkpoint of its Pebble store while it keeps running. auditd hands the
files over in the JetStream object store gantry_audit_backups, so this works
from any machine; the command copies them into DIR (new or empty), checks
every file's size and SHA-256, writes gantry-audit-backup.json and deletes
the hand-over copies.

Restore: stop auditd (or gantry run), move <data>/audit aside, copy DIR to
<data>/audit, start it again. DIR is itself a store: 'gantry auditd --data X'
with DIR copied to X/audit answers queries from it.`,
		Example: `  gantry audit backup /backups/audit-2026-11-30`,
		Args:    exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.auditBackup(cmd.Context(), args[0], wait)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Minute, "how long the backup may take")
	return cmd
}

func (a *app) auditBackup(ctx context.Context, dir string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return a.withClient(ctx, "gantry-audit-backup", func(c *client.Client) error {
		reply, err := c.BackupAudit(ctx, dir)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(reply)
		}
		fmt.Fprintf(a.stdout, "audit store backed up into %s: %d files, %d bytes, taken %s\n",
			dir, len(reply.Files), total(reply.Files, func(f wire.AuditBackupFile) int64 { return f.Size }), reply.Time.Local().Format(eventTimeLayout))
		return nil
	})
}
