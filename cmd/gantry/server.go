package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
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
	cluster      clusterFlags
	audit        auditdFlags // gantry run only
}

// clusterFlags are the cluster and leaf settings of the embedded broker;
// each overrides the config file's broker section when given.
type clusterFlags struct {
	name        string
	cluster     string
	clusterName string
	routes      []string
	replicas    int
	domain      string
	leaf        string
	leafListen  string
	leafDomains []string
}

func (s *serverFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.configPath, "config", "", "YAML config file (see examples/gantry.yaml)")
	f.StringVar(&s.dataDir, "data", defaultDataDir(), "data directory for streams, buckets and the audit store")
	f.StringVar(&s.natsListen, "nats-listen", "127.0.0.1:4222", "host:port NATS clients connect to; beyond loopback needs auth.users in the config")
	f.StringVar(&s.httpListen, "http-listen", "127.0.0.1:8420", "host:port of the dashboard, /healthz, /readyz and /metrics; empty turns HTTP off")
	f.StringVar(&s.sync, "sync", string(broker.SyncInterval), "disk flush policy: interval (fast; a power cut can lose the last --sync-interval of writes) or always (fsync before every ack, ~50x slower writes)")
	f.DurationVar(&s.syncInterval, "sync-interval", time.Second, "flush interval under --sync interval")
	c := &s.cluster
	f.StringVar(&c.name, "name", "", "this server's name in a cluster (default gantry-<port>; broker.name)")
	f.StringVar(&c.cluster, "cluster", "", "host:port of this member's cluster listener: makes the broker a JetStream cluster member (broker.cluster)")
	f.StringVar(&c.clusterName, "cluster-name", "", "the cluster's name, the same on every member (default gantry; broker.cluster_name)")
	f.StringSliceVar(&c.routes, "routes", nil, "the members' cluster URLs, nats-route://host:port, comma separated (broker.routes)")
	f.IntVar(&c.replicas, "replicas", 0, "replicas of every stream and bucket (default: 3 once the cluster has 3 servers, else 1; broker.replicas)")
	f.StringVar(&c.domain, "domain", "", "this broker's JetStream domain (a leaf's defaults to its host name; broker.domain)")
	f.StringVar(&c.leaf, "leaf", "", "attach to a hub as a leaf: its leafnode URL, nats-leaf://[user:pass@]host:port (broker.leaf)")
	f.StringVar(&c.leafListen, "leaf-listen", "", "host:port leaf brokers attach to, on a hub (broker.leaf_listen)")
	f.StringSliceVar(&c.leafDomains, "leaf-domains", nil, "the leaf brokers' domains whose audit events this hub's GANTRY_AUDIT sources (broker.leaf_domains)")
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
	bc, err := s.brokerConfig(cfg)
	if err != nil {
		return nil, err
	}
	bc.Logger = log.With("component", "broker")
	b, err := broker.New(bc)
	if err != nil {
		if !errors.Is(err, broker.ErrInsecureListen) {
			err = usageError("%v", err)
		}
		return nil, err
	}
	if len(cfg.Auth.Users) > 0 && bc.TLS == nil && !bc.DontListen && !broker.IsLoopback(hostOf(bc.Listen)) {
		log.Warn("passwords travel in clear: configure tls.client, or give users nkeys", "listen", bc.Listen)
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

// brokerConfig builds the broker's configuration from the flags and the
// config file: a flag given wins over the file.
func (s *serverFlags) brokerConfig(cfg *config.File) (broker.Config, error) {
	bc := broker.Config{
		DataDir:      s.dataDir,
		Listen:       s.natsListen,
		Sync:         broker.SyncPolicy(s.sync),
		SyncInterval: s.syncInterval,
		TLS:          brokerTLS(cfg.TLS.Client),
	}
	for _, u := range cfg.Auth.Users {
		bc.Users = append(bc.Users, broker.User{Name: u.User, Password: u.Password, NKey: u.NKey, Role: broker.Role(u.Role)})
	}
	if o := cfg.Auth.Operator; o != nil {
		bc.Operator = &broker.Operator{OperatorJWT: o.JWT, AccountJWT: o.Account, AccountSeed: o.AccountSeed, SystemAccountJWT: o.SystemAccount}
	}
	fb, c := cfg.Broker, s.cluster
	bc.ServerName = cmp.Or(c.name, fb.Name)
	bc.Replicas = cmp.Or(c.replicas, fb.Replicas)
	bc.Domain = cmp.Or(c.domain, fb.Domain)
	if addr := cmp.Or(c.cluster, fb.Cluster); addr != "" {
		routes := c.routes
		if len(routes) == 0 {
			routes = fb.Routes
		}
		bc.Cluster = &broker.Cluster{Name: cmp.Or(c.clusterName, fb.ClusterName), Listen: addr, Routes: routes,
			TLS: brokerTLS(cfg.TLS.Cluster)}
	} else if len(c.routes) > 0 || len(fb.Routes) > 0 {
		return bc, usageError("--routes needs --cluster HOST:PORT (this member's cluster listener)")
	}
	leaf, listen := cmp.Or(c.leaf, fb.Leaf), cmp.Or(c.leafListen, fb.LeafListen)
	domains := c.leafDomains
	if len(domains) == 0 {
		domains = fb.LeafDomains
	}
	if leaf != "" || listen != "" || len(domains) > 0 {
		bc.Leaf = &broker.Leaf{Listen: listen, TLS: brokerTLS(cfg.TLS.Leaf), Credentials: fb.LeafCredentials,
			RemoteTLS: brokerTLS(cfg.TLS.LeafRemote), Sources: domains}
		if leaf != "" {
			bc.Leaf.Remotes = strings.Split(leaf, ",")
			bc.Domain = cmp.Or(bc.Domain, hostDomain())
		}
	}
	for _, d := range append([]string{bc.Domain}, domains...) {
		if d != "" && !wire.ValidToken(d) {
			return bc, usageError("domain %q: want letters, digits, '-' and '_'", d)
		}
	}
	return bc, nil
}

// brokerTLS converts the config file's TLS settings.
func brokerTLS(t *config.TLS) *broker.TLS {
	if t == nil {
		return nil
	}
	return &broker.TLS{Cert: t.Cert, Key: t.Key, CA: t.CA, Verify: t.Verify}
}

// hostDomain is a leaf broker's default JetStream domain: its host name,
// as a subject token.
func hostDomain() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "leaf"
	}
	h, _, _ = strings.Cut(h, ".")
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') {
			return r
		}
		return '_'
	}, h)
}

// hostOf returns the host of a host:port, or addr when it has no port.
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// httpTLS returns the TLS configuration of HTTP that cfg's tls.http asks
// for, or nil.
func httpTLS(cfg *config.File) (*tls.Config, error) {
	t := cfg.TLS.HTTP
	if t == nil {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("tls.http: %w", err))
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
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
	// HTTP beyond loopback only with authentication configured, as NATS.
	if sf.httpListen != "" && !broker.IsLoopback(hostOf(sf.httpListen)) && !cfg.Auth.Configured() {
		return withCode(exitUsage, fmt.Errorf("%w: --http-listen %q is not a loopback address; configure users (auth.users in the config file) or listen on 127.0.0.1", broker.ErrInsecureListen, sf.httpListen))
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
	// (waiting tasks, consumers, leases, routes...) among the metrics, and
	// TLS when tls.http is set.
	var err error
	if p.httpTLS, err = httpTLS(cfg); err != nil {
		return err
	}
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
	// /readyz: the broker can store what it is sent (a full disk fails it).
	if p.http != nil {
		p.http.addCheck("broker", func(context.Context) error { return b.Healthy() })
	}
	if add == nil {
		return nil
	}
	return add(p, b, cfg, log)
}
