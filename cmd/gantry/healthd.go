package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/healthd"
	"github.com/gantry-dev/gantry/internal/config"
)

func (a *app) healthdCommand() *cobra.Command {
	var cf componentFlags
	cmd := &cobra.Command{
		Use:   "healthd --config FILE",
		Short: "Probe the egress routes of the config file and keep their health in gantry_routes",
		Long: `Healthd runs only the route health checker, connected to a broker with
--server, for a system split across machines ('gantry run' includes it).

Every route of the config file's routes section is probed on its interval in
three stages: a TCP connect to its proxy (or to the probe URL's host when the
route is direct), a GET of probe_url through the route (HTTP CONNECT or
SOCKS5), and, with expect_ip or expect_region, a GET of expect_url whose
reported exit IP and region must match. Each route's score is

  100 - latency_ms/20 - 15*consecutive_failures - 10*recent_timeouts

Below 50 the route goes to COOLDOWN (1m, doubling while it keeps failing, at
most 30m), is probed again when the cooldown ends and returns to AVAILABLE
when that probe succeeds. Failed http tasks through a route count too.

State lives in the gantry_routes bucket ('gantry route ls'); each probe's
result is published on gantry.health.route.<id>; ROUTE_COOLDOWN and
ROUTE_RECOVERED are audit events; 'gantry route probe ID' asks for a probe
now. Routes stored in gantry_routes but absent from the config are marked
DISABLED. Run one healthd per set of routes.

Started before its broker, healthd waits for it (--connect-timeout); it
logs every loss and return of the broker.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.healthd(cmd.Context(), &cf) },
	}
	cf.register(cmd, "routes section (the routes to probe)")
	return cmd
}

func (a *app) healthd(ctx context.Context, cf *componentFlags) error {
	log, cfg, err := a.startComponent(cf, "routes")
	if errors.Is(err, config.ErrInvalid) {
		a.rejectConfig(ctx, log, "healthd", err)
	}
	if err != nil {
		return err
	}
	nc, js, err := a.connectComponent(ctx, log, cf, "gantry-healthd")
	if err != nil {
		return err
	}
	// healthd: probes the routes, keeps gantry_routes current.
	hd, err := newHealthd(cfg, log, nc, js)
	if err != nil {
		nc.Close()
		return err
	}
	p := newProcess(log)
	p.conns = append(p.conns, nc)
	p.attrs = append(p.attrs, "nats", nc.ConnectedUrlRedacted(), "routes", len(cfg.Routes))

	// HTTP, when asked for: /healthz, /readyz (unready while cut off from
	// the broker) and /metrics.
	if err := a.addComponentHTTP(p, cf.httpListen, nc); err != nil {
		p.abort()
		return err
	}

	// Signals: SIGINT and SIGTERM stop healthd cleanly.
	p.addSignals(ctx)

	p.addActor("healthd", hd)
	return p.run()
}

// newHealthd builds healthd for the routes of the config file; 'gantry run'
// and 'gantry healthd' share it.
func newHealthd(cfg *config.File, log *slog.Logger, nc *nats.Conn, js jetstream.JetStream) (*healthd.Healthd, error) {
	return healthd.New(healthd.Config{Routes: cfg.Routes, Logger: log}, nc, js)
}
