package main

import (
	"context"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/dashboard"
	"github.com/gantry-dev/gantry/internal/config"
)

// defaultUIListen is where 'gantry ui' serves the dashboard unless told
// otherwise: the port 'gantry run' serves it on.
const defaultUIListen = "127.0.0.1:8420"

func (a *app) uiCommand() *cobra.Command {
	var cf componentFlags
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web dashboard of a running system, from any machine",
		Long: `ui serves the web dashboard (the one 'gantry run' serves at / on its
--http-listen) as a client of the broker --server names: it needs nothing
else, so it can run on any machine that reaches the broker. It logs
"gantry ready" with the dashboard's URL.

On loopback without users it trusts the machine. With users (auth.users in
--config, each with its role) every request needs one of them: a login
page, or HTTP basic authentication over TLS (tls.http in --config).
Listening beyond loopback needs users. See docs/dashboard.md.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.ui(cmd.Context(), &cf)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cf.configPath, "config", "", "YAML config file; the dashboard uses its auth section (its users may log in) and tls.http")
	fl.DurationVar(&cf.connectTimeout, "connect-timeout", defaultConnectTimeout,
		"how long to wait for the broker at start (0: wait until it answers); once connected, a lost broker is waited for without end")
	fl.StringVar(&cf.httpListen, "http-listen", defaultUIListen, "host:port of the dashboard (and /healthz, /readyz, /metrics); beyond loopback needs auth.users in --config")
	return cmd
}

func (a *app) ui(ctx context.Context, cf *componentFlags) error {
	log, err := a.logger()
	if err != nil {
		return err
	}
	if cf.httpListen == "" {
		return usageError("--http-listen: the dashboard needs an address (host:port)")
	}
	cfg, err := cf.load()
	if err != nil {
		return err
	}
	logSections(log, cf.configPath, cfg, "auth", "tls")
	host, _, err := net.SplitHostPort(cf.httpListen)
	if err != nil {
		return usageError("--http-listen %q: %v", cf.httpListen, err)
	}
	if len(dashboardUsers(cfg)) == 0 && !broker.IsLoopback(host) {
		return usageError("--http-listen %q: %v", cf.httpListen, dashboard.ErrInsecure)
	}
	tlsConf, err := httpTLS(cfg)
	if err != nil {
		return err
	}
	nc, _, err := a.connectComponent(ctx, log, cf, "gantry-ui")
	if err != nil {
		return err
	}
	p := newProcess(log)
	p.httpTLS = tlsConf
	p.conns = append(p.conns, nc)
	p.attrs = append(p.attrs, "nats", nc.ConnectedUrlRedacted())
	p.addSignals(ctx)
	if err := p.addHTTP(cf.httpListen, nc); err != nil {
		p.abort()
		return err
	}
	if err := p.addDashboard(nc, cfg); err != nil {
		p.abort()
		return err
	}
	return p.run()
}

// addDashboard serves the dashboard at / on the process's HTTP server, as a
// client on nc, with the users of cfg's auth section; without HTTP it does
// nothing. The dashboard runs as an actor (it follows the finished tasks
// and route probes) and its live streams end when HTTP shuts down.
func (p *process) addDashboard(nc *nats.Conn, cfg *config.File) error {
	if p.http == nil {
		return nil
	}
	log := p.log.With("component", "dashboard")
	c, err := client.New(nc, client.WithComponent("dashboard"), client.WithLogger(log))
	if err != nil {
		return err
	}
	d, err := dashboard.New(c, dashboard.Config{
		Listen:  p.http.Addr(),
		Users:   dashboardUsers(cfg),
		TLS:     p.httpTLS != nil,
		Logger:  log,
		Version: readVersion().Gantry,
	})
	if err != nil {
		return err
	}
	if d.Insecure() {
		log.Warn("the dashboard refuses every request: it listens beyond loopback without users", "http", p.http.Addr())
	}
	p.http.mux.Handle("/", d)
	p.http.srv.RegisterOnShutdown(d.Stop)
	p.addActor("dashboard", d)
	return nil
}

// dashboardUsers are the users of cfg's auth section who may log in to the
// dashboard.
func dashboardUsers(cfg *config.File) []dashboard.User {
	users := make([]dashboard.User, 0, len(cfg.Auth.Users))
	for _, u := range cfg.Auth.Users {
		users = append(users, dashboard.User{Name: u.User, Password: u.Password, Role: dashboard.Role(u.Role)})
	}
	return users
}
