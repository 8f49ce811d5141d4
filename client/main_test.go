package client_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/workers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// bundle is one test's broker and a client connected to it.
type bundle struct {
	env *brokertest.Env
	c   *client.Client
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := brokertest.Start(t)
	c, err := client.Connect(context.Background(), client.Options{Servers: env.URL, Name: t.Name()},
		client.WithLogger(env.Log.With("component", "client")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close = %v, want nil", err)
		}
	})
	return &bundle{env: env, c: c}
}

// ctx returns a context that ends with the test or after d.
func ctx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// actor is a component: workers, scheduler, auditd, healthd.
type actor interface {
	Run(context.Context) error
	Stop()
	Ready() <-chan struct{}
}

// run runs a until the test ends, and waits until it is ready.
func run(t *testing.T, a actor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		a.Stop()
		stop := time.AfterFunc(10*time.Second, cancel)
		defer stop.Stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		cancel()
	})
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before ready", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
}

// startWorkers runs workers with handlers on a connection of their own.
func (b *bundle) startWorkers(t *testing.T, cfg workers.Config, handlers map[string]workers.Handler) {
	t.Helper()
	nc, _ := brokertest.Connect(t, b.env.URL)
	cfg.Logger = b.env.Log.With("component", "workers")
	w, err := workers.New(cfg, nc)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := w.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	run(t, w)
}
