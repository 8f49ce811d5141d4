package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/backup"
	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/logging"
)

func (a *app) backupCommand() *cobra.Command {
	var (
		noAudit bool
		wait    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "backup DIR",
		Short: "Take an online backup of the whole system into DIR",
		Long: `Backup takes a backup of everything gantry holds while it runs: every stream
and KV bucket (tasks waiting and running, task records, leases, resources,
jobs, routes, checkpoints, the audit stream) through JetStream's own snapshot
API, consumers' state included, and the audit store through the Pebble
checkpoint auditd makes. The data travels over NATS, so this works from any
machine that reaches the broker. DIR must be new or empty.

DIR gets gantry-backup.json (gantry and server versions, times, each stream's
sequences and sizes, and the size and SHA-256 of every file), streams/<name>/
(as 'nats stream backup' writes them) and audit/ (the store's files).

Check a backup with 'gantry backup verify DIR'; bring it back with
'gantry restore DIR --data NEWDIR'. For backups on a schedule, add a job of the
built-in type backup (see docs/operations.md).`,
		Example: `  gantry backup /backups/gantry-2026-11-30
  gantry backup --server nats://plant-pc:4222 --user ops --password … /backups/plant
  gantry backup verify /backups/gantry-2026-11-30`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.backup(cmd.Context(), args[0], noAudit, wait)
		},
	}
	cmd.Flags().BoolVar(&noAudit, "no-audit", false, "leave the audit store out (for a system without auditd)")
	cmd.Flags().DurationVar(&wait, "wait", time.Hour, "how long the backup may take")
	cmd.AddCommand(a.backupVerifyCommand())
	return cmd
}

func (a *app) backup(ctx context.Context, dir string, noAudit bool, wait time.Duration) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return a.withClient(ctx, "gantry-backup", func(c *client.Client) error {
		show, done := a.progress("backing up")
		m, err := backup.Take(ctx, c.Conn(), dir, backup.Config{NoAudit: noAudit, Progress: show})
		done()
		if errors.Is(err, client.ErrUnavailable) && !noAudit {
			return fmt.Errorf("%w; or pass --no-audit to leave the audit store out", err)
		}
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(m)
		}
		what := fmt.Sprintf("%d streams (%d messages)", len(m.Streams), total(m.Streams, func(s wire.BackupStream) uint64 { return s.Messages }))
		if m.Audit != nil {
			what += " and the audit store"
		}
		_, err = fmt.Fprintf(a.stdout, "backed up %s into %s: %d files, %s, in %s\n",
			what, dir, len(m.Files), byteSize(total(m.Files, func(f wire.BackupFile) int64 { return f.Size })), m.Finished.Sub(m.Started).Round(time.Millisecond))
		return err
	})
}

func (a *app) backupVerifyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "verify DIR",
		Short: "Check a backup against its manifest without restoring it",
		Long: `Verify reads DIR's gantry-backup.json and checks that every file it lists is
there with its size and SHA-256. It exits 0 when the backup is whole, and 2
naming every missing, truncated or corrupted file otherwise. It needs no
broker.`,
		Example: `  gantry backup verify /backups/gantry-2026-11-30`,
		Args:    exactArgs(1, "DIR"),
		RunE: func(_ *cobra.Command, args []string) error {
			return a.backupVerify(args[0])
		},
	}
}

// verifyReport is what 'gantry backup verify --json' prints.
type verifyReport struct {
	Dir      string               `json:"dir"`
	OK       bool                 `json:"ok"`
	Problems []string             `json:"problems"`
	Manifest *wire.BackupManifest `json:"manifest,omitempty"`
}

func (a *app) backupVerify(dir string) error {
	v, err := backup.Verify(dir)
	var bad *backup.CorruptError
	if err != nil && !errors.As(err, &bad) {
		return err
	}
	if a.json {
		r := verifyReport{Dir: dir, OK: err == nil, Problems: []string{}}
		if bad != nil {
			r.Problems = bad.Problems
		} else {
			r.Manifest = &v.Manifest
		}
		if perr := a.printJSON(r); perr != nil {
			return perr
		}
		return err
	}
	if err != nil {
		return err
	}
	m := v.Manifest
	_, err = fmt.Fprintf(a.stdout, "backup %s is whole: %d files checked; taken %s by gantry %s from nats-server %s\n",
		dir, len(m.Files), m.Started.Local().Format(time.DateTime), m.GantryVersion, m.ServerVersion)
	return err
}

func (a *app) restoreCommand() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "restore DIR --data NEWDIR",
		Short: "Restore a backup into a fresh data dir",
		Long: `Restore first checks every file of the backup in DIR against its manifest
(exit 2 naming what is missing, truncated or corrupted, before anything is
written). Then it starts a broker on NEWDIR, which must be new or empty (a
restore never goes over a live data dir), listening on no port, restores each
stream through JetStream's restore API (consumers' state included), puts the
audit store in NEWDIR/audit, and stops.

Leases from before the backup are not honoured: every one is revoked (a
LEASE_REVOKED event each) and the resources they held go back to AVAILABLE
(or FAULT, by their reclaim policy) with a RESOURCE_STATE_CHANGED event. A
task that ended while the backup was taken (its record was taken before its
end, the task stream after) gets its record completed from its TASK_FINISHED
event; one whose message the backup does not hold (it was published after
the task stream was taken) is set NEEDS_REVIEW, saying so. The events are
stored when the restored system first runs.

Then start it with 'gantry run --data NEWDIR': the tasks that waited in the
backup run, and those that were running run again once their ack deadline
(--ack-wait) has passed.`,
		Example: `  gantry restore /backups/gantry-2026-11-30 --data /var/lib/gantry-new
  gantry run --data /var/lib/gantry-new`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.restore(cmd.Context(), args[0], dataDir)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data", "", "the new data dir to restore into (new or empty; required)")
	return cmd
}

func (a *app) restore(ctx context.Context, dir, dataDir string) (err error) {
	if dataDir == "" {
		return usageError("--data NEWDIR is required: the new data dir to restore into")
	}
	log, err := a.logger()
	if err != nil {
		return err
	}
	v, err := backup.Verify(dir)
	if err != nil {
		return err
	}
	entries, statErr := os.ReadDir(dataDir)
	created := errors.Is(statErr, os.ErrNotExist)
	switch {
	case statErr != nil && !created:
		return usageError("--data %s: %v", dataDir, statErr)
	case len(entries) > 0:
		return usageError("--data %s is not empty: restore only into a new or empty data dir, never over a live one", dataDir)
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	defer func() {
		if err == nil {
			return
		}
		if created {
			_ = os.RemoveAll(dataDir)
			return
		}
		entries, _ := os.ReadDir(dataDir)
		for _, e := range entries {
			_ = os.RemoveAll(filepath.Join(dataDir, e.Name()))
		}
	}()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	restored, err := a.restoreInto(ctx, v, dataDir, log)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(restored)
	}
	msgs := total(restored.Streams, func(s backup.RestoredStream) uint64 { return s.Messages })
	_, err = fmt.Fprintf(a.stdout, "restored %s into %s: %d streams (%d messages), %d audit store files; "+
		"%d leases revoked, %d resources reclaimed, %d task records completed, %d tasks set NEEDS_REVIEW\n"+
		"start it with: gantry run --data %s\n",
		dir, dataDir, len(restored.Streams), msgs, restored.AuditFiles, len(restored.LeasesRevoked),
		len(restored.ResourcesReclaimed), len(restored.TasksCompleted), len(restored.TasksParked), dataDir)
	return err
}

// restoreInto runs a broker on dataDir, listening on no port, for as long
// as the restore takes.
func (a *app) restoreInto(ctx context.Context, v *backup.Verified, dataDir string, log *slog.Logger) (backup.Restored, error) {
	brokerLog := log
	if !strings.EqualFold(a.logLevel, "debug") {
		// The server's start-up banner is noise here.
		if l, err := logging.New(a.stderr, logging.Format(a.logFormat), "warn"); err == nil {
			brokerLog = l
		}
	}
	b, err := broker.New(broker.Config{DataDir: dataDir, Listen: "127.0.0.1:0", DontListen: true, Logger: brokerLog.With("component", "broker")})
	if err != nil {
		return backup.Restored{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.Start(sctx); err != nil {
		return backup.Restored{}, fmt.Errorf("start broker on %s: %w", dataDir, err)
	}
	defer b.Shutdown()
	nc, err := b.Connect("gantry-restore")
	if err != nil {
		return backup.Restored{}, err
	}
	defer nc.Close()
	show, done := a.progress("restoring")
	defer done()
	return v.Restore(ctx, nc, backup.RestoreConfig{AuditDir: auditStoreDir(dataDir), Progress: show, Logger: log.With("component", "restore")})
}

// progress returns a backup.Progress callback that keeps one line on
// stderr up to date while it is a terminal (and does nothing otherwise),
// and a function that clears the line.
func (a *app) progress(verb string) (func(backup.Progress), func()) {
	if !logging.IsTerminal(a.stderr) {
		return nil, func() {}
	}
	var (
		mu    sync.Mutex
		last  time.Time
		width int
	)
	show := func(line string) {
		pad := max(width-len(line), 0)
		width = len(line)
		fmt.Fprint(a.stderr, "\r"+line+strings.Repeat(" ", pad))
	}
	update := func(p backup.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if !p.Done && p.Bytes > 0 && time.Since(last) < 100*time.Millisecond {
			return
		}
		last = time.Now()
		show(fmt.Sprintf("%s [%d/%d] %s %s", verb, p.Index, p.Parts, p.Part, byteSize(p.Bytes)))
	}
	done := func() {
		mu.Lock()
		defer mu.Unlock()
		if width > 0 {
			show("")
			fmt.Fprint(a.stderr, "\r")
		}
	}
	return update, done
}

// byteSize writes n bytes for people: 512 B, 3.4 KiB, 12.0 MiB.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
