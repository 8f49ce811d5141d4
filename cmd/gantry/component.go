package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/internal/config"
)

// defaultConnectTimeout is how long a component started before its broker
// waits for it.
const defaultConnectTimeout = time.Minute

// componentFlags are the flags every component process that connects to a
// broker shares (worker, scheduler, healthd, auditd): the config file,
// whose sections the component owns it uses, and how long to wait for the
// broker.
type componentFlags struct {
	configPath     string
	connectTimeout time.Duration
	httpListen     string
}

func (f *componentFlags) register(cmd *cobra.Command, uses string) {
	fl := cmd.Flags()
	fl.StringVar(&f.configPath, "config", "", "YAML config file (see examples/gantry.yaml); this command uses its "+uses)
	fl.DurationVar(&f.connectTimeout, "connect-timeout", defaultConnectTimeout,
		"how long to wait for the broker at start (0: wait until it answers); once connected, a lost broker is waited for without end")
	fl.StringVar(&f.httpListen, "http-listen", "", "host:port of /healthz, /readyz (unready while cut off from the broker) and /metrics (this component's own metrics); empty: no HTTP")
}

// load reads the config file, or returns an empty one when none is named.
func (f *componentFlags) load() (*config.File, error) {
	return (&serverFlags{configPath: f.configPath}).loadConfig()
}

// sectionOwners says which process uses each section of the config file
// when the system is split; 'gantry run' uses them all.
var sectionOwners = []struct {
	section, owner string
	set            func(*config.File) bool
}{
	{"auth", "gantry broker", func(f *config.File) bool { return f.Auth.Configured() }},
	{"broker", "gantry broker", func(f *config.File) bool {
		b := f.Broker
		return b.Name != "" || b.Cluster != "" || len(b.Routes) > 0 || b.Leaf != "" || b.LeafListen != "" || b.Domain != ""
	}},
	{"tls", "gantry broker", func(f *config.File) bool { return f.TLS != config.TLSSettings{} }},
	{"routes", "gantry healthd", func(f *config.File) bool { return len(f.Routes) > 0 }},
	{"resources", "gantry worker (its keeper registers them)", func(f *config.File) bool { return len(f.Resources) > 0 }},
	{"databases", "gantry worker", func(f *config.File) bool { return len(f.Databases) > 0 }},
	{"jobs", "gantry scheduler", func(f *config.File) bool { return len(f.Jobs) > 0 }},
	{"workers", "gantry worker", func(f *config.File) bool { return f.Workers.TaskRetention != nil }},
	{"alerts", "gantry alertd", func(f *config.File) bool {
		return len(f.Alerts.Rules)+len(f.Alerts.Webhooks)+len(f.Alerts.Email) > 0
	}},
}

// allSections names every section: 'gantry run' uses them all.
func allSections() []string {
	names := make([]string, 0, len(sectionOwners))
	for _, s := range sectionOwners {
		names = append(names, s.section)
	}
	return names
}

// logSections says, for each section of cfg that this process does not
// use, which process does: a section given to the wrong command is not
// ignored silently.
func logSections(log *slog.Logger, path string, cfg *config.File, uses ...string) {
	for _, s := range sectionOwners {
		used := false
		for _, u := range uses {
			used = used || u == s.section
		}
		if !used && s.set(cfg) {
			log.Info("config section not used by this command", "config", path, "section", s.section, "used_by", s.owner)
		}
	}
}

// startComponent does what a lone component command does first: it opens
// the log, checks --http-listen and loads the config file, then logs the
// sections of it the component does not use (see logSections). An error
// after the log opened comes back with the log, to report it with.
func (a *app) startComponent(cf *componentFlags, uses ...string) (*slog.Logger, *config.File, error) {
	log, err := a.logger()
	if err != nil {
		return nil, nil, err
	}
	if err := a.checkComponentHTTP(cf.httpListen); err != nil {
		return log, nil, err
	}
	cfg, err := cf.load()
	if err != nil {
		return log, nil, err
	}
	logSections(log, cf.configPath, cfg, uses...)
	return log, cfg, nil
}

// connectComponent opens the connection of a component process. A broker
// that does not answer yet is waited for, up to --connect-timeout, saying
// so; once connected, every loss and return of the broker is logged with
// its URL, and the connection retries without end.
func (a *app) connectComponent(ctx context.Context, log *slog.Logger, cf *componentFlags, name string) (*nats.Conn, jetstream.JetStream, error) {
	log = log.With("component", "nats")
	connected := make(chan struct{})
	var once sync.Once
	opts := append(a.client.options(name).NATSOptions(),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(time.Second),
		nats.ConnectHandler(func(*nats.Conn) { once.Do(func() { close(connected) }) }),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("broker connection lost; reconnecting", "server", a.serverURL(nc), "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("broker connection back", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("broker refused", "err", err)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Warn("broker connection closed", "server", a.serverURL(nc), "err", err)
			}
		}),
	)
	nc, err := nats.Connect(a.client.server, opts...)
	if err != nil {
		return nil, nil, connectHint(fmt.Errorf("connect to %s: %w", a.client.server, err))
	}
	if !nc.IsConnected() {
		log.Info("waiting for the broker", "server", a.client.server, "connect_timeout", cf.connectTimeout)
		var timeout <-chan time.Time
		if cf.connectTimeout > 0 {
			t := time.NewTimer(cf.connectTimeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-connected:
		case <-timeout:
			last := nc.LastError()
			nc.Close()
			return nil, nil, connectHint(fmt.Errorf("no broker answered at %s within --connect-timeout %v: %v", a.client.server, cf.connectTimeout, last))
		case <-ctx.Done():
			nc.Close()
			return nil, nil, fmt.Errorf("waiting for the broker at %s: %w", a.client.server, ctx.Err())
		}
	}
	log.Info("connected to the broker", "server", nc.ConnectedUrlRedacted())
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// serverURL names the server nc is (or was last) connected to, without
// credentials.
func (a *app) serverURL(nc *nats.Conn) string {
	if u := nc.ConnectedUrlRedacted(); u != "" {
		return u
	}
	return a.client.server
}
