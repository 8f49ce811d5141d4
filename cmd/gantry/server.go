package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/internal/config"
)

// serverFlags are the flags of the commands that embed the broker.
type serverFlags struct {
	configPath   string
	dataDir      string
	natsListen   string
	httpListen   string
	sync         string
	syncInterval time.Duration
	audit        auditdFlags // gantry run only
}

func (s *serverFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.configPath, "config", "", "YAML config file (see examples/gantry.yaml)")
	f.StringVar(&s.dataDir, "data", defaultDataDir(), "data directory for streams, buckets and the audit store")
	f.StringVar(&s.natsListen, "nats-listen", "127.0.0.1:4222", "host:port NATS clients connect to; beyond loopback needs auth.users in the config")
	f.StringVar(&s.httpListen, "http-listen", "127.0.0.1:8420", "host:port of the dashboard, /healthz, /readyz and /metrics; empty turns HTTP off")
	f.StringVar(&s.sync, "sync", string(broker.SyncInterval), "disk flush policy: interval (fast; a power cut can lose the last --sync-interval of writes) or always (fsync before every ack, ~50x slower writes)")
	f.DurationVar(&s.syncInterval, "sync-interval", time.Second, "flush interval under --sync interval")
}

// defaultDataDir is where gantry keeps its data unless told otherwise: the
// user's data directory, so that a desktop run survives a change of working
// directory.
func defaultDataDir() string {
	if runtime.GOOS == "linux" {
		if d := os.Getenv("XDG_DATA_HOME"); d != "" {
			return filepath.Join(d, "gantry")
		}
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, ".local", "share", "gantry")
		}
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "gantry")
	}
	return "gantry-data"
}

// loadConfig reads the config file, or returns an empty one when none is
// named.
func (s *serverFlags) loadConfig() (*config.File, error) {
	if s.configPath == "" {
		return &config.File{}, nil
	}
	f, err := config.Load(s.configPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, usageError("%v", err)
		}
		return nil, err
	}
	return f, nil
}

// startBroker creates the data dir and starts the embedded broker.
func (s *serverFlags) startBroker(ctx context.Context, cfg *config.File, log *slog.Logger) (*broker.Broker, error) {
	if s.sync != string(broker.SyncAlways) && s.sync != string(broker.SyncInterval) {
		return nil, usageError("--sync %q: want always or interval", s.sync)
	}
	users := make([]broker.User, 0, len(cfg.Auth.Users))
	for _, u := range cfg.Auth.Users {
		users = append(users, broker.User{Name: u.User, Password: u.Password})
	}
	b, err := broker.New(broker.Config{
		DataDir:      s.dataDir,
		Listen:       s.natsListen,
		Sync:         broker.SyncPolicy(s.sync),
		SyncInterval: s.syncInterval,
		Users:        users,
		Logger:       log.With("component", "broker"),
	})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.Start(sctx); err != nil {
		if errors.Is(err, broker.ErrListen) {
			return nil, listenError("--nats-listen", "NATS_LISTEN", err)
		}
		return nil, fmt.Errorf("start broker: %w", err)
	}
	return b, nil
}

// listenError says what to do about an address a listener could not take
// (exit 2): usually another process holds the port.
func listenError(flag, makeVar string, err error) error {
	return usageError("%s: %v\n  another process (a nats-server, another gantry) may hold the port: stop it, "+
		"or choose a free one with %s HOST:PORT ('make run %s=127.0.0.1:PORT')", flag, err, flag, makeVar)
}

// components adds a process's components once the broker runs.
type components func(p *process, b *broker.Broker, cfg *config.File, log *slog.Logger) error

// serve runs a process that embeds the broker: it loads the config (of
// which it uses the sections named in uses), starts the broker, adds the
// signal handler, HTTP and the components, and runs them until a signal.
// The broker starts before the group and stops after every actor has
// returned, so shutdown never depends on interrupt order.
func (a *app) serve(ctx context.Context, sf *serverFlags, uses []string, add components) error {
	log, err := a.logger()
	if err != nil {
		return err
	}
	cfg, err := sf.loadConfig()
	if err != nil {
		return err
	}
	logSections(log, sf.configPath, cfg, uses...)
	b, err := sf.startBroker(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer b.Shutdown()
	p := newProcess(log)
	p.attrs = append(p.attrs, "nats", b.ClientURL(), "data_dir", sf.dataDir)

	// Signals: SIGINT and SIGTERM stop the process cleanly.
	p.addSignals(ctx)

	if err := a.addServing(p, b, sf, cfg, log, add); err != nil {
		p.abort()
		return err
	}
	return p.run()
}

// addServing adds HTTP and the components to p.
func (a *app) addServing(p *process, b *broker.Broker, sf *serverFlags, cfg *config.File, log *slog.Logger, add components) error {
	// HTTP: /healthz, /readyz and /metrics, with the system's picture
	// (waiting tasks, consumers, leases, routes...) among the metrics.
	httpConn, _, err := p.connect(b, "http")
	if err != nil {
		return err
	}
	if err := p.addHTTP(sf.httpListen, httpConn); err != nil {
		return err
	}
	if err := p.addSystemMetrics(httpConn); err != nil {
		return err
	}
	// Dashboard: the web dashboard at / on the same listener (see ui.go).
	if err := p.addDashboard(httpConn, cfg); err != nil {
		return err
	}
	if add == nil {
		return nil
	}
	return add(p, b, cfg, log)
}
