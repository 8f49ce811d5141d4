// Package brokertest starts the production broker for a test: a random
// loopback port, a t.TempDir() store, the server's log in t.Log, every stream
// and bucket provisioned, and everything shut down by t.Cleanup.
package brokertest

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

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

// OperatorFiles writes, under dir, the files of a NATS operator-mode set-up
// for a test: the operator's JWT, the JWT of an account with JetStream and
// of the system account (both signed by the operator), and the account's
// seed.
func OperatorFiles(t testing.TB, dir string) (operatorJWT, accountJWT, accountSeed, systemJWT string) {
	t.Helper()
	opKP, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	account := func(name string, js bool) (nkeys.KeyPair, string, string) {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		token, err := ac.Encode(opKP)
		if err != nil {
			t.Fatal(err)
		}
		return kp, pub, token
	}
	accKP, _, accToken := account("gantry", true)
	_, sysPub, sysToken := account("SYS", false)
	opPub, _ := opKP.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.SystemAccount = sysPub
	opToken, err := oc.Encode(opKP)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := accKP.Seed()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("operator.jwt", []byte(opToken)), write("account.jwt", []byte(accToken)), write("account.nk", seed),
		write("system.jwt", []byte(sysToken))
}
