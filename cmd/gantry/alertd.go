package main

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/alertd"
	"github.com/gantry-dev/gantry/internal/config"
)

func (a *app) alertdCommand() *cobra.Command {
	var cf componentFlags
	cmd := &cobra.Command{
		Use:   "alertd --config FILE",
		Short: "Run the alerting component alone, connected to a broker with --server",
		Long: `Alertd checks the rules of the config file's alerts section and sends the
alerts they raise, for a system split across machines ('gantry run'
includes it). Rules: needs_review (per task type), long_running (a task
running longer than after), route_down, resource_fault, leader_lost (no
scheduler leads) and audit_lag. Each alert is an audit event on
gantry.audit.alert.<kind>, and goes to the webhooks (a JSON POST signed
with X-Gantry-Signature, retried with backoff) and email sinks (SMTP with
STARTTLS and AUTH PLAIN), at most one per rule and subject per window; what
the window holds back is counted into the next alert. A failing sink never
holds anything else back. See docs/operations.md, Alerting. Run one
alertd per system: two would send every alert twice.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.alertd(cmd.Context(), &cf) },
	}
	cf.register(cmd, "alerts section (rules and sinks)")
	return cmd
}

func (a *app) alertd(ctx context.Context, cf *componentFlags) error {
	log, cfg, err := a.startComponent(cf, "alerts")
	if err != nil {
		return err
	}
	nc, _, err := a.connectComponent(ctx, log, cf, "gantry-alertd")
	if err != nil {
		return err
	}
	p := newProcess(log)
	p.conns = append(p.conns, nc)
	p.attrs = append(p.attrs, "nats", nc.ConnectedUrlRedacted(), "rules", len(cfg.Alerts.Rules))

	// Signals: SIGINT and SIGTERM stop alertd cleanly.
	p.addSignals(ctx)

	// HTTP, when asked for: /healthz, /readyz (unready while cut off from
	// the broker) and alertd's /metrics.
	if err := a.addComponentHTTP(p, cf.httpListen, nc); err != nil {
		p.abort()
		return err
	}

	// alertd: checks the rules, sends the alerts.
	if err := p.addAlertd(cfg, log, nc); err != nil {
		p.abort()
		return err
	}
	return p.run()
}

// addAlertd adds alertd, with the config file's alerts section, to the
// process. A sink whose secret cannot be read is the config's fault: exit 2.
func (p *process) addAlertd(cfg *config.File, log *slog.Logger, nc *nats.Conn) error {
	ad, err := alertd.New(alertd.Config{Alerts: cfg.Alerts, Logger: log.With("component", "alertd"), Metrics: p.reg}, nc)
	if err != nil {
		return err
	}
	p.addActor("alertd", ad)
	return nil
}
