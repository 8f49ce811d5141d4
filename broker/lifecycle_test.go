package broker_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/lifecycle"
)

// TestLifecycle misuses Start and Shutdown: whatever the order, nothing
// panics or hangs, a Shutdown that returns leaves the server stopped, and
// goleak finds no server goroutine left.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		test func(t *testing.T, b *broker.Broker)
	}{
		{"shutdown before start", func(t *testing.T, b *broker.Broker) {
			b.Shutdown()
			b.Shutdown()
			startOK(t, b)
			url := serving(t, b)
			b.Shutdown()
			stopped(t, url)
		}},
		{"shutdown twice at once", func(t *testing.T, b *broker.Broker) {
			startOK(t, b)
			url := serving(t, b)
			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() {
					b.Shutdown()
					stopped(t, url)
				})
			}
			wg.Wait()
			b.Shutdown()
		}},
		{"start twice", func(t *testing.T, b *broker.Broker) {
			startOK(t, b)
			if err := b.Start(ctx(t)); !errors.Is(err, lifecycle.ErrAlreadyRun) {
				t.Errorf("second Start = %v, want %v", err, lifecycle.ErrAlreadyRun)
			}
			url := serving(t, b)
			b.Shutdown()
			stopped(t, url)
		}},
		{"start after shutdown", func(t *testing.T, b *broker.Broker) {
			startOK(t, b)
			url := serving(t, b)
			b.Shutdown()
			if err := b.Start(ctx(t)); !errors.Is(err, lifecycle.ErrAlreadyRun) {
				t.Errorf("Start after Shutdown = %v, want %v", err, lifecycle.ErrAlreadyRun)
			}
			stopped(t, url)
		}},
		{"failed start", func(t *testing.T, b *broker.Broker) {
			// The server starts, then provisioning fails: Start shuts it
			// down.
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			if err := b.Start(cancelled); err == nil {
				t.Fatal("Start with a cancelled context = nil, want an error")
			}
			stopped(t, b.ClientURL())
			b.Shutdown()
			b.Shutdown()
			if err := b.Start(ctx(t)); !errors.Is(err, lifecycle.ErrAlreadyRun) {
				t.Errorf("Start after a failed Start = %v, want %v", err, lifecycle.ErrAlreadyRun)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Logger: brokertest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Shutdown)
			c.test(t, b)
		})
	}
}

func startOK(t *testing.T, b *broker.Broker) {
	t.Helper()
	if err := b.Start(ctx(t)); err != nil {
		t.Fatalf("Start = %v, want nil", err)
	}
}

// serving checks that b accepts a client and returns its URL.
func serving(t *testing.T, b *broker.Broker) string {
	t.Helper()
	url := b.ClientURL()
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect %s = %v, want the broker serving", url, err)
	}
	nc.Close()
	return url
}

// stopped checks that nothing accepts a client at url any more.
func stopped(t *testing.T, url string) {
	t.Helper()
	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Errorf("connect %s = nil error after Shutdown, want the server stopped", url)
	}
}

// TestStartPortInUse: a port another process holds fails Start at once
// with ErrListen naming the address, not after the ready timeout.
func TestStartPortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: ln.Addr().String(), Logger: brokertest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	start := time.Now()
	err = b.Start(ctx(t))
	if !errors.Is(err, broker.ErrListen) || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("Start on a taken port = %v, want ErrListen naming %s", err, ln.Addr())
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Start on a taken port took %v, want under 1s", d)
	}
}
