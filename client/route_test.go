package client_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/healthd"
	"github.com/gantry-dev/gantry/internal/config"
)

func TestProbeRouteThroughHealthd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 30*time.Second)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(site.Close)

	if _, err := c.ProbeRoute(ctx, "office"); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("ProbeRoute without healthd = %v, want ErrUnavailable", err)
	}
	h, err := healthd.New(healthd.Config{Logger: b.env.Log, Routes: []config.Route{
		{ID: "office", Proxy: wire.RouteDirect, ProbeURL: site.URL, Interval: config.Duration(time.Hour)},
	}}, b.env.NC, b.env.JS)
	if err != nil {
		t.Fatal(err)
	}
	run(t, h)

	probe, err := c.ProbeRoute(ctx, "office", client.ApplyProbe())
	if err != nil || !probe.Result.OK || probe.Route.ID != "office" || probe.Route.State != wire.RouteAvailable || probe.Route.ConsecutiveSuccesses < 1 {
		t.Fatalf("ProbeRoute = %+v, %v; want an ok probe of office, AVAILABLE", probe, err)
	}
	routes, err := c.Routes(ctx)
	if err != nil || len(routes) != 1 || routes[0].ID != "office" || routes[0].LastChecked == nil {
		t.Errorf("Routes = %+v, %v; want office, checked", routes, err)
	}
	var se *client.ServiceError
	if _, err := c.ProbeRoute(ctx, "nope"); !errors.Is(err, client.ErrNotFound) || !errors.As(err, &se) || se.Code != "404" {
		t.Errorf("ProbeRoute(nope) = %v, want a 404 matching ErrNotFound", err)
	}
	if _, err := c.ProbeRoute(ctx, "a.b"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("ProbeRoute(a.b) = %v, want ErrInvalid", err)
	}
}
