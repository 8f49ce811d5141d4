package client

import (
	"context"
	"fmt"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Routes returns every egress route's health, as healthd keeps it in
// gantry_routes.
func (c *Client) Routes(ctx context.Context) ([]Route, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	store, err := c.routeStore(ctx)
	if err != nil {
		return nil, err
	}
	return store.List(ctx)
}

// ProbeRoute asks healthd (gantry.api.route.probe, from any machine) to
// probe route id now. healthd records the result like any probe's (a
// success ends a cooldown) and answers with it and the route's new state;
// a failed probe is a result, not an error. A route healthd does not probe
// is ErrNotFound; no healthd is ErrUnavailable. A probe may take healthd's
// probe timeout (10 s by default): give ctx a deadline beyond it.
func (c *Client) ProbeRoute(ctx context.Context, id string) (RouteProbe, error) {
	if !wire.ValidToken(id) {
		return RouteProbe{}, fmt.Errorf("%w: route id %q: must be non-empty, without spaces, '.', '*' or '>'", ErrInvalid, id)
	}
	hint := fmt.Sprintf("no healthd answered on %s: start 'gantry run' or 'gantry healthd' with a config that has route %q", wire.SubjectRouteProbe, id)
	var reply RouteProbe
	if err := c.request(ctx, wire.SubjectRouteProbe, hint, wire.RouteProbeRequest{ID: id}, &reply); err != nil {
		return RouteProbe{}, fmt.Errorf("probe route %q: %w", id, err)
	}
	if reply.Result == nil || reply.Route == nil {
		return RouteProbe{}, fmt.Errorf("probe route %q: healthd answered without a result", id)
	}
	return reply, nil
}
