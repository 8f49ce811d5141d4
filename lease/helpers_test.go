package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/lease"
)

// newResources returns a resource store on env.
func newResources(t testing.TB, env *brokertest.Env) *lease.Resources {
	t.Helper()
	r, err := lease.NewResources(env.JS, lease.ResourcesConfig{Audit: audit.NewEmitter(env.JS, "test", nil), Logger: env.Log})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// setupResources starts a broker and returns it with a resource store on
// it, where specs are registered, and a context that ends with the test.
func setupResources(t *testing.T, specs ...lease.ResourceSpec) (*brokertest.Env, *lease.Resources, context.Context) {
	t.Helper()
	env := brokertest.Start(t)
	r := newResources(t, env)
	ctx := leaseCtx(t)
	for _, spec := range specs {
		if _, err := r.Add(ctx, spec); err != nil {
			t.Fatalf("add resource %s: %v", spec.ID, err)
		}
	}
	return env, r, ctx
}

// auditEvents returns every stored audit event of type typ about resource.
func auditEvents(t *testing.T, env *brokertest.Env, typ wire.EventType, resource string) []wire.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := env.JS.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{FilterSubjects: []string{typ.Subject()}})
	if err != nil {
		t.Fatal(err)
	}
	var out []wire.Event
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatal(err)
			}
			if ev.ResourceID == resource {
				out = append(out, ev)
			}
		}
		if n == 0 {
			return out
		}
	}
}

// waitEvents polls until at least n events of typ about resource are
// stored, and returns them.
func waitEvents(t *testing.T, env *brokertest.Env, typ wire.EventType, resource string, n int) []wire.Event {
	t.Helper()
	var evs []wire.Event
	check.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if evs = auditEvents(t, env, typ, resource); len(evs) < n {
			return fmt.Errorf("%s events for %s = %d, want at least %d", typ, resource, len(evs), n)
		}
		return nil
	})
	return evs
}

// resourceOf returns the state of resource id.
func resourceOf(t *testing.T, r *lease.Resources, id string) lease.Resource {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := r.Get(ctx, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return res
}
