package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/internal/config"
)

func (a *app) runCommand() *cobra.Command {
	var sf serverFlags
	var wf workerFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the embedded broker and every component in one process",
		Long: `Run starts the embedded NATS JetStream broker and every gantry component in
one process, and logs the line "gantry ready" (with the NATS and HTTP URLs)
once clients can connect and every component runs. SIGINT or SIGTERM drains
and stops it. It uses every section of the config file.

The workers take the flags of 'gantry worker' (--queue, --concurrency,
--prioritize...): by default they run the queue "default". Exec tasks'
checkpoint files are under <data>/checkpoints.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.run(cmd.Context(), &sf, &wf, cmd.Flags().Changed)
		},
	}
	sf.register(cmd)
	sf.audit.register(cmd.Flags())
	wf.register(cmd)
	return cmd
}

func (a *app) run(ctx context.Context, sf *serverFlags, wf *workerFlags, changed func(name string) bool) error {
	wf.dataDir = sf.dataDir
	if _, err := wf.config(slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	return a.serve(ctx, sf, allSections(), func(p *process, b *broker.Broker, cfg *config.File, log *slog.Logger) error {
		// Keeper: registers the config's resources (an existing one keeps its
		// state), records lease expiries (LEASE_EXPIRED) and returns resources
		// whose holder's lease is gone to AVAILABLE (or FAULT, by policy).
		_, keeperJS, err := p.connect(b, "keeper")
		if err != nil {
			return err
		}
		if err := p.addKeeper(keeperJS, log, resourceSpecs(cfg)); err != nil {
			return err
		}

		// healthd: probes the config's egress routes, keeps their health in
		// gantry_routes and answers 'gantry route probe'.
		hdConn, hdJS, err := p.connect(b, "healthd")
		if err != nil {
			return err
		}
		hd, err := newHealthd(cfg, log, hdConn, hdJS)
		if err != nil {
			return err
		}
		p.addActor("healthd", hd)

		// auditd: every audit event into the Pebble store under <data>/audit,
		// the gantry-audit query/backup service, retention (--audit-retention).
		auditConn, _, err := p.connect(b, "auditd")
		if err != nil {
			return err
		}
		if err := p.addAuditd(auditConn, sf.dataDir, &sf.audit); err != nil {
			return err
		}

		// Scheduler: applies the config's jobs, watches gantry_jobs and, while
		// it leads, fires each job's task (see 'gantry scheduler --help').
		_, schedJS, err := p.connect(b, "scheduler")
		if err != nil {
			return err
		}
		if err := p.addScheduler(cfg, log, schedJS); err != nil {
			return err
		}

		// Workers: run the tasks of the queues of the worker flags (see
		// 'gantry worker --help') with the config's workers section under
		// them; http tasks with a route go out through gantry_routes, sql
		// tasks to the config's databases.
		workNC, workJS, err := p.connect(b, "workers")
		if err != nil {
			return err
		}
		if err := wf.fromConfig(cfg, changed); err != nil {
			return err
		}
		if err := p.addWorkers(ctx, wf, log, workNC, workJS); err != nil {
			return err
		}
		return nil
	})
}
