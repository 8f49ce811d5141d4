// Package brokertest starts the production broker for a test: a random
// loopback port, a t.TempDir() store, the server's log in t.Log, every stream
// and bucket provisioned, and everything shut down by t.Cleanup.
package brokertest

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker"
)

// Env is a running broker and a client connected to it.
type Env struct {
	Broker *broker.Broker
	// URL is the broker's client URL (nats://127.0.0.1:<port>).
	URL     string
	DataDir string
	NC      *nats.Conn
	JS      jetstream.JetStream
	Log     *slog.Logger
}

// Option changes the broker configuration of a test.
type Option func(*broker.Config)

// WithDataDir reuses dir as the store, to test a restart.
func WithDataDir(dir string) Option { return func(c *broker.Config) { c.DataDir = dir } }

// WithSync sets the sync policy.
func WithSync(p broker.SyncPolicy) Option { return func(c *broker.Config) { c.Sync = p } }

// Start starts a broker for t and connects a client to it over TCP.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	log := Logger(t)
	cfg := broker.Config{
		DataDir: t.TempDir(),
		Listen:  "127.0.0.1:0",
		Sync:    broker.SyncInterval,
		Logger:  log.With("component", "broker"),
	}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	t.Cleanup(b.Shutdown)
	env := &Env{Broker: b, URL: b.ClientURL(), DataDir: cfg.DataDir, Log: log}
	env.NC, env.JS = Connect(t, env.URL)
	return env
}

// Connect opens a client to url, closed by t.Cleanup.
func Connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Logger returns a logger writing to t.Log, at debug level in tests and
// warn level in benchmarks. It stops writing
// once the test has finished, since t.Log then panics.
func Logger(t testing.TB) *slog.Logger {
	t.Helper()
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	level := slog.LevelDebug
	if _, bench := t.(*testing.B); bench {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// FreePorts returns n loopback ports that were free a moment ago, for the
// listeners a test must name before they start (a cluster's routes). They
// are drawn below the kernel's ephemeral range, so that the outgoing
// connections of other tests cannot take them meanwhile.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		p := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil || slices.Contains(ports, p) {
			continue
		}
		ln.Close()
		ports = append(ports, p)
	}
	return ports
}
