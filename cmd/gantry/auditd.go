package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gantry-dev/gantry/auditd"
	"github.com/gantry-dev/gantry/internal/config"
)

// auditdFlags are the audit store's flags, on `gantry auditd` and
// `gantry run`.
type auditdFlags struct {
	retention retentionValue
}

func (f *auditdFlags) register(fs *pflag.FlagSet) {
	f.retention = retentionValue(auditd.DefaultRetention)
	fs.Var(&f.retention, "audit-retention",
		"how long the audit store keeps an event, by the event's time (e.g. 90d, 36h); 0 keeps every event forever")
}

// config returns the sink's configuration for the store in dir, its
// metrics on reg.
func (f *auditdFlags) config(dir string, log *slog.Logger, reg prometheus.Registerer) auditd.Config {
	ret := time.Duration(f.retention)
	if ret == 0 {
		ret = auditd.KeepForever
	}
	return auditd.Config{Dir: dir, Retention: ret, Logger: log.With("component", "auditd"), Metrics: reg}
}

// retentionValue is a duration flag that also takes days ("30d"), as the
// config file's retentions do.
type retentionValue time.Duration

func (r *retentionValue) String() string {
	d := time.Duration(*r)
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

func (r *retentionValue) Set(s string) error {
	d, err := config.ParseRetention(s)
	if err != nil {
		return err
	}
	*r = retentionValue(d)
	return nil
}

func (r *retentionValue) Type() string { return "duration" }

// auditStoreDir is where the audit store lives under a data dir.
func auditStoreDir(dataDir string) string { return filepath.Join(dataDir, "audit") }

func (a *app) auditdCommand() *cobra.Command {
	var (
		af      auditdFlags
		cf      componentFlags
		dataDir string
	)
	cmd := &cobra.Command{
		Use:   "auditd",
		Short: "Run the audit store alone, connected to a broker with --server",
		Long: `Auditd runs only the audit store: a durable consumer on the GANTRY_AUDIT
stream writes every event, from every machine, into a Pebble store under
<data>/audit, and the NATS service gantry-audit answers 'gantry audit query'
and 'gantry audit backup' from any machine. Events older than
--audit-retention are removed. Run one auditd per system: two would split
the events between their stores.

Started before its broker, auditd waits for it (--connect-timeout); it logs
every loss and return of the broker.

'gantry run' includes it; use this command when the system is split across
machines.`,
		Example: `  gantry auditd --server nats://broker-host:4222 --data /var/lib/gantry --audit-retention 90d`,
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.auditd(cmd.Context(), dataDir, &af, &cf)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data", defaultDataDir(), "data directory; the audit store is <data>/audit")
	af.register(cmd.Flags())
	cf.register(cmd, "no section (it checks the file, so one file serves every process)")
	return cmd
}

func (a *app) auditd(ctx context.Context, dataDir string, af *auditdFlags, cf *componentFlags) error {
	log, _, err := a.startComponent(cf)
	if err != nil {
		return err
	}
	nc, _, err := a.connectComponent(ctx, log, cf, "gantry-auditd")
	if err != nil {
		return err
	}
	defer nc.Close()
	p := newProcess(log)
	svc, err := auditd.New(af.config(auditStoreDir(dataDir), log, p.reg), nc)
	if err != nil {
		return err
	}
	p.attrs = append(p.attrs, "nats", nc.ConnectedUrlRedacted(), "audit_dir", auditStoreDir(dataDir))

	// HTTP, when asked for: /healthz, /readyz (unready while cut off from
	// the broker) and auditd's /metrics.
	if err := a.addComponentHTTP(p, cf.httpListen, nc); err != nil {
		p.abort()
		return err
	}
	p.addSignals(ctx)
	p.addActor("auditd", svc)
	err = p.run()
	_ = nc.Drain()
	return err
}

// addAuditd adds the audit store, under dataDir, to a process.
func (p *process) addAuditd(nc *nats.Conn, dataDir string, af *auditdFlags) error {
	svc, err := auditd.New(af.config(auditStoreDir(dataDir), p.log, p.reg), nc)
	if err != nil {
		return err
	}
	p.addActor("auditd", svc)
	return nil
}
