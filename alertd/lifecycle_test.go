package alertd

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
)

func TestLifecycle(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	// A needs_review rule, so that Run starts a consumer, and a webhook, so
	// that it starts a sink's deliveries: all that a stop must end.
	alerts := config.Alerts{
		CheckInterval: config.Duration(50 * time.Millisecond),
		Rules:         []config.AlertRule{{Name: "review", Kind: config.AlertNeedsReview}},
		Webhooks:      []config.Webhook{{Name: "hook", URL: "http://127.0.0.1:1/"}},
	}
	var n atomic.Int64
	newAlertd := func(t testing.TB, env *brokertest.Env) *Alertd {
		// A durable consumer of its own: the cases run side by side.
		a, err := New(Config{Alerts: alerts, Consumer: fmt.Sprintf("alertd-%d", n.Add(1)), Logger: env.Log}, env.NC)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	t.Run("misuse", func(t *testing.T) {
		lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor { return newAlertd(t, env) })
	})
	t.Run("failed start", func(t *testing.T) {
		// A broker of its own, without the audit stream to consume.
		env := brokertest.Start(t)
		if err := env.JS.DeleteStream(context.Background(), wire.StreamAudit); err != nil {
			t.Fatal(err)
		}
		lifecycletest.FailedStart(t, newAlertd(t, env))
	})
}
