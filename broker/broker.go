package broker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// SyncPolicy says when JetStream flushes stored messages to disk.
type SyncPolicy string

const (
	// SyncAlways fsyncs every write before it is acknowledged: an
	// acknowledged task or lease survives a power cut or an OS crash. It
	// costs throughput (see docs/BENCHMARKS.md).
	SyncAlways SyncPolicy = "always"
	// SyncInterval fsyncs every Config.SyncInterval: writes acknowledged in
	// the last interval can be lost on a power cut or OS crash (not on a
	// process crash).
	SyncInterval SyncPolicy = "interval"
)

// The range of Config.SyncInterval. nats-server panics on a sync interval
// under 2ns; one under MinSyncInterval would flush all the time, one over
// MaxSyncInterval leaves too much at risk.
const (
	MinSyncInterval = 10 * time.Millisecond
	MaxSyncInterval = time.Hour
)

// ErrInsecureListen is returned by New when the broker would listen beyond
// loopback without authentication.
var ErrInsecureListen = errors.New("listening beyond loopback needs authentication")

// ErrListen is returned by Start when the server cannot listen on its
// address (another process holds the port, or the address is not this
// machine's); Start returns it within a moment, not after ReadyTimeout.
var ErrListen = errors.New("cannot listen")

// User is a NATS user the broker accepts: a name and password, or an
// NKey (its public key; the client proves it holds the seed).
type User struct {
	Name     string
	Password string
	// NKey is the user's public NKey (U...), instead of Name and Password.
	NKey string
	// Role is what the user may do. Defaults to RoleOperator.
	Role Role
}

// TLS is a listener's certificate and key, and the CA that verifies the
// certificates of its peers.
type TLS struct {
	// Cert and Key are PEM files: the certificate the listener presents.
	Cert, Key string
	// CA is a PEM file of the CA certificates peers' certificates must
	// chain to (and, for the side that dials, the server's).
	CA string
	// Verify requires a client certificate signed by CA. Routes between
	// cluster members always verify both sides.
	Verify bool
}

// Cluster makes the broker a member of a JetStream cluster.
type Cluster struct {
	// Name names the cluster; every member uses the same. Defaults to
	// "gantry".
	Name string
	// Listen is the host:port other members' routes connect to.
	Listen string
	// Routes are the other members' cluster URLs (nats-route://host:port
	// or nats://host:port); listing this member too is harmless.
	Routes []string
	// TLS secures the routes, verifying both sides. Required when Listen
	// is beyond loopback.
	TLS *TLS
}

// Leaf attaches the broker to a hub as a leafnode, or lets leaf brokers
// attach to it.
type Leaf struct {
	// Listen is the host:port leaf brokers attach to (on the hub).
	Listen string
	// TLS secures Listen.
	TLS *TLS
	// Remotes are the hub's leafnode URLs (nats-leaf://[user:pass@]host:port)
	// this broker attaches to (on a leaf desktop). Only JetStream traffic
	// between the domains crosses: gantry's subjects stay on each side.
	Remotes []string
	// Credentials is a creds file the leaf authenticates to the hub with.
	Credentials string
	// RemoteTLS is the CA (and client certificate) of the link to the hub.
	RemoteTLS *TLS
	// Sources are the JetStream domains of the leaf brokers whose audit
	// streams the hub's GANTRY_AUDIT sources (on the hub).
	Sources []string
}

// Config configures a Broker.
type Config struct {
	// DataDir is where JetStream stores streams and buckets. Required.
	DataDir string
	// Listen is the host:port clients connect to. Port 0 picks a free port.
	// Defaults to 127.0.0.1:4222.
	Listen string
	// DontListen turns the TCP listener off; only in-process connections
	// work. Defaults to false.
	DontListen bool
	// Sync is the disk flush policy. Defaults to SyncInterval: a process
	// crash loses nothing, a power cut or OS crash can lose the writes of
	// the last SyncInterval; SyncAlways closes that gap at ~50x the cost per
	// write (docs/operations.md).
	Sync SyncPolicy
	// SyncInterval is the flush interval under SyncInterval, from
	// MinSyncInterval to MaxSyncInterval. Defaults to 1s.
	SyncInterval time.Duration
	// Users, when set, are the only credentials the broker accepts, and
	// allow listening beyond loopback. Defaults to none (no authentication,
	// loopback only).
	Users []User
	// Operator, when set, runs the broker in NATS operator mode: users are
	// creds files (JWTs) signed by its account, instead of Users.
	Operator *Operator
	// TLS, when set, makes the client listener require TLS.
	TLS *TLS
	// ServerName names this server; required to tell servers of a cluster
	// apart. Defaults to "gantry-" and the listen port.
	ServerName string
	// Cluster, when set, makes the broker a member of a JetStream cluster.
	Cluster *Cluster
	// Leaf attaches the broker to a hub, or lets leaf brokers attach.
	Leaf *Leaf
	// Domain is the broker's JetStream domain: a leaf broker has its own,
	// so that its streams stay apart from the hub's. Defaults to none.
	Domain string
	// Replicas is the replica count of every stream and bucket. Defaults to
	// 0: 3 once the cluster has 3 servers or more, else 1; an existing
	// stream is never lowered by the default, only by an explicit count.
	Replicas int
	// MaxPayload bounds one message, in bytes. Defaults to 1 MiB.
	MaxPayload int32
	// ReadyTimeout bounds the wait for the server to accept clients.
	// Defaults to 10s.
	ReadyTimeout time.Duration
	// Logger receives the server's log. Defaults to discarding it.
	Logger *slog.Logger
	// MinFreeSpace is the room, in bytes, the data dir needs for the
	// broker to be ready (Healthy), and to restart JetStream after a write
	// failed for want of it. Defaults to DefaultMinFreeSpace (64 MiB).
	MinFreeSpace uint64
	// StorageCheck is how often a failed store is checked for room again.
	// Defaults to DefaultStorageCheck (2 s).
	StorageCheck time.Duration
}

// Broker is an embedded NATS server with JetStream. It starts once: Start
// starts it, Shutdown stops it and waits, from any goroutine, any number of
// times; a Shutdown before Start does nothing.
type Broker struct {
	cfg          Config
	log          *slog.Logger
	host         string
	port         int
	internalUser User
	// internalJWT and internalSeed are the in-process user in operator
	// mode.
	internalJWT  string
	internalSeed []byte

	// mu guards started and srv: Start claims the broker and sets srv
	// under it, so a Shutdown during Start finds the server.
	mu           sync.Mutex
	started      bool
	srv          *server.Server
	shutdownOnce sync.Once
	// stopWatch ends the cluster size watch; watched is closed when it
	// has returned.
	stopWatch context.CancelFunc
	watched   chan struct{}
	// fatal receives the server's first fatal error (a listener that
	// could not start), which it logs and does not return.
	fatal chan error

	// storage watches the store and restarts JetStream after a write
	// failed for want of room.
	storage storage
}

// internalUserName is the user in-process components connect as when
// authentication is configured.
const internalUserName = "gantry-internal"

// New validates cfg, fills its defaults and prepares a broker. It does not
// start it.
func New(cfg Config) (*Broker, error) {
	cfg.Listen = cmp.Or(cfg.Listen, "127.0.0.1:4222")
	cfg.Sync = cmp.Or(cfg.Sync, SyncInterval)
	cfg.SyncInterval = cmp.Or(cfg.SyncInterval, time.Second)
	cfg.MaxPayload = cmp.Or(cfg.MaxPayload, 1<<20)
	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, 10*time.Second)
	cfg.MinFreeSpace = cmp.Or(cfg.MinFreeSpace, DefaultMinFreeSpace)
	cfg.StorageCheck = cmp.Or(cfg.StorageCheck, DefaultStorageCheck)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("broker: a data dir is required")
	}
	if cfg.Sync != SyncAlways && cfg.Sync != SyncInterval {
		return nil, fmt.Errorf("broker: unknown sync policy %q (want %q or %q)", cfg.Sync, SyncAlways, SyncInterval)
	}
	if cfg.SyncInterval < MinSyncInterval || cfg.SyncInterval > MaxSyncInterval {
		return nil, fmt.Errorf("broker: sync interval %v: want %v to %v", cfg.SyncInterval, MinSyncInterval, MaxSyncInterval)
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("broker: listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("broker: listen address %q: bad port", cfg.Listen)
	}
	if err := cfg.validate(host); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	cfg.ServerName = cmp.Or(cfg.ServerName, "gantry-"+portStr)
	b := &Broker{cfg: cfg, log: cfg.Logger, host: host, port: port, fatal: make(chan error, 1)}
	b.storage.b = b
	if len(cfg.Users) > 0 {
		b.internalUser = User{Name: internalUserName, Password: randomSecret()}
	}
	return b, nil
}

// IsLoopback reports whether host names only this machine.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func randomSecret() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start starts the server, waits until it accepts clients and JetStream is
// ready, and provisions every stream and bucket. On error the server is shut
// down. A broker starts once: a second Start, even after a failed one or a
// Shutdown, returns lifecycle.ErrAlreadyRun.
func (b *Broker) Start(ctx context.Context) error {
	opts, err := b.serverOptions()
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if b.cfg.Cluster != nil {
		if err := checkClusterable(b.cfg.DataDir); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	srv, err := b.newServer(opts)
	if err != nil {
		return err
	}
	go srv.Start()
	if err := b.awaitReady(srv); err != nil {
		b.Shutdown()
		return err
	}
	if err := b.provision(ctx, srv); err != nil {
		b.Shutdown()
		return err
	}
	if err := b.storage.start(); err != nil {
		b.Shutdown()
		return err
	}
	attrs := []any{"url", b.ClientURL(), "data_dir", b.cfg.DataDir, "sync", string(b.cfg.Sync), "server_name", b.cfg.ServerName}
	if b.cfg.Cluster != nil {
		attrs = append(attrs, "cluster", srv.ClusterAddr().String())
	}
	if b.cfg.Domain != "" {
		attrs = append(attrs, "domain", b.cfg.Domain)
	}
	b.log.Info("broker started", attrs...)
	return nil
}

// followLeader is how long a cluster member that does not lead waits for
// the meta leader to provision before it provisions itself.
const followLeader = 10 * time.Second

// sizeWatchInterval is how often a cluster member checks whether the
// cluster grew enough to raise the streams' replicas.
const sizeWatchInterval = 2 * time.Second

// watchSize raises every stream and bucket to AutoReplicas of the
// cluster's size when the cluster grows (a third member joins two), until
// Shutdown.
func (b *Broker) watchSize(srv *server.Server, size int) {
	ctx, cancel := context.WithCancel(context.Background())
	b.stopWatch, b.watched = cancel, make(chan struct{})
	go func() {
		defer close(b.watched)
		t := time.NewTicker(sizeWatchInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			jsz, err := srv.Jsz(nil)
			if err != nil || jsz.Meta == nil || AutoReplicas(jsz.Meta.Size) <= AutoReplicas(size) {
				continue
			}
			if err := b.provisionAt(ctx, jsz.Meta.Size); err != nil {
				b.log.Warn("raise replicas", "cluster_size", jsz.Meta.Size, "err", err)
				continue
			}
			size = jsz.Meta.Size
			b.log.Info("cluster grew: streams and buckets raised", "cluster_size", size, "replicas", AutoReplicas(size))
		}
	}()
}

// provision waits for JetStream (in a cluster: for a meta leader) and
// provisions every stream and bucket with the replica count the cluster's
// size calls for.
func (b *Broker) provision(ctx context.Context, srv *server.Server) error {
	if b.cfg.Cluster != nil {
		b.log.Info("waiting for the JetStream cluster to elect a meta leader")
	}
	size, err := waitMetaLeader(ctx, srv)
	if err != nil {
		return err
	}
	if err := b.provisionAt(ctx, size); err != nil {
		return err
	}
	if b.cfg.Cluster != nil && b.cfg.Replicas == 0 {
		b.watchSize(srv, size)
	}
	return nil
}

// provisionAt provisions for a cluster of size servers.
func (b *Broker) provisionAt(ctx context.Context, size int) error {
	nc, err := b.Connect("gantry-provision")
	if err != nil {
		return err
	}
	defer nc.Close()
	pc := ProvisionConfig{Replicas: b.cfg.Replicas, ClusterSize: size}
	if b.cfg.Cluster != nil && !b.server().JetStreamIsLeader() {
		pc.Follow = followLeader
	}
	if b.cfg.Leaf != nil {
		pc.AuditSources = b.cfg.Leaf.Sources
	}
	return Provision(ctx, nc, pc)
}

// waitMetaLeader waits until JetStream answers: at once on a single
// server, once a meta leader is elected in a cluster. It returns the
// cluster's size (1 for a single server).
func waitMetaLeader(ctx context.Context, srv *server.Server) (int, error) {
	for {
		if srv.JetStreamIsCurrent() {
			if !srv.JetStreamIsClustered() {
				return 1, nil
			}
			if jsz, err := srv.Jsz(nil); err == nil && jsz.Meta != nil && jsz.Meta.Leader != "" {
				return jsz.Meta.Size, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for a JetStream meta leader (are the other cluster members up?): %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitReady waits until srv accepts clients, for at most ReadyTimeout; a
// fatal error of the server (its listener could not start) ends the wait
// at once.
func (b *Broker) awaitReady(srv *server.Server) error {
	deadline := time.Now().Add(b.cfg.ReadyTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-b.fatal:
			return err
		default:
		}
		if srv.ReadyForConnections(25 * time.Millisecond) {
			return nil
		}
	}
	return fmt.Errorf("server not ready after %s", b.cfg.ReadyTimeout)
}

// newServer claims the broker for its one start and creates its server.
func (b *Broker) newServer(opts *server.Options) (*server.Server, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		return nil, fmt.Errorf("broker: start: %w", lifecycle.ErrAlreadyRun)
	}
	b.started = true
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("create server: %w", err)
	}
	srv.SetLogger(&logAdapter{log: b.log, listen: b.cfg.Listen, fatal: b.fatal, onError: b.storage.noteLog}, false, false)
	b.srv = srv
	return srv, nil
}

// server returns the server Start created, or nil.
func (b *Broker) server() *server.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv
}

// ClientURL is the URL remote clients connect to, or "" when not listening.
func (b *Broker) ClientURL() string {
	srv := b.server()
	if srv == nil || b.cfg.DontListen {
		return ""
	}
	return srv.ClientURL()
}

// Connect opens an in-process client connection to the broker, with the
// internal credentials when authentication is configured.
func (b *Broker) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	srv := b.server()
	if srv == nil {
		return nil, errors.New("broker not started")
	}
	base := []nats.Option{nats.Name(name), nats.InProcessServer(srv), nats.MaxReconnects(-1)}
	if b.internalUser.Name != "" {
		base = append(base, nats.UserInfo(b.internalUser.Name, b.internalUser.Password))
	}
	if b.internalJWT != "" {
		base = append(base, nats.UserJWTAndSeed(b.internalJWT, string(b.internalSeed)))
	}
	nc, err := nats.Connect("", append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect in-process: %w", err)
	}
	return nc, nil
}

// Shutdown stops the server and waits for it to finish; every call, from
// any goroutine, returns once the server has stopped. Before Start it does
// nothing, and a later Start and Shutdown start and stop the server as
// usual.
func (b *Broker) Shutdown() {
	srv := b.server()
	if srv == nil {
		return
	}
	b.shutdownOnce.Do(func() {
		if b.stopWatch != nil {
			b.stopWatch()
			<-b.watched
		}
		b.storage.close()
		srv.Shutdown()
		srv.WaitForShutdown()
		b.log.Info("broker stopped")
	})
}

// logAdapter routes nats-server's log into slog, and its errors and
// warnings to onError too (the storage watch looks for failed writes). The
// server's own "Server is ready" goes to debug: gantry logs its own ready
// line once every component runs, and nothing else may look like it.
type logAdapter struct {
	log *slog.Logger
	// listen is the client address, named in a fatal listen error.
	listen  string
	fatal   chan<- error
	onError func(msg string)
}

func (l *logAdapter) Noticef(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if msg == "Server is ready" {
		l.log.Debug("nats-server accepts clients")
		return
	}
	l.log.Info(msg)
}
func (l *logAdapter) Warnf(format string, v ...any)  { l.warn(fmt.Sprintf(format, v...)) }
func (l *logAdapter) Errorf(format string, v ...any) { l.error(fmt.Sprintf(format, v...)) }
func (l *logAdapter) Debugf(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *logAdapter) Tracef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }

func (l *logAdapter) warn(msg string) {
	l.log.Warn(msg)
	l.onError(msg)
}

func (l *logAdapter) error(msg string) {
	l.log.Error(msg)
	l.onError(msg)
}

// Fatalf logs a fatal error of the server, which then carries on without
// the part that failed, and hands the first one to Start. A listener that
// could not start is ErrListen, with the OS's reason.
func (l *logAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.error(msg)
	err := errors.New(msg)
	for _, a := range v {
		if e, ok := a.(error); ok && strings.HasPrefix(format, "Error listening on port") {
			err = fmt.Errorf("%w on %s: %w", ErrListen, l.listen, e)
		}
	}
	select {
	case l.fatal <- err:
	default:
	}
}
