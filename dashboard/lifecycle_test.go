package dashboard_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/dashboard"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
)

func TestLifecycle(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	newDashboard := func(t testing.TB, nc *nats.Conn) *dashboard.Dashboard {
		c, err := client.New(nc, client.WithComponent("dashboard"))
		if err != nil {
			t.Fatal(err)
		}
		d, err := dashboard.New(c, dashboard.Config{Listen: "127.0.0.1:0", Logger: env.Log})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Run("misuse", func(t *testing.T) {
		lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor { return newDashboard(t, env.NC) })
	})
	t.Run("failed start", func(t *testing.T) {
		// Its connection closed: it cannot follow the route probes.
		nc, _ := brokertest.Connect(t, env.URL)
		d := newDashboard(t, nc)
		nc.Close()
		lifecycletest.FailedStart(t, d)
	})
}
