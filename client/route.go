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

// ProbeOption tunes ProbeRoute.
type ProbeOption func(*wire.RouteProbeRequest)

// ApplyProbe has healthd record the probe's outcome like a scheduled
// probe's: a success ends a cooldown, a failure counts and may start or
// lengthen one.
func ApplyProbe() ProbeOption { return func(r *wire.RouteProbeRequest) { r.Apply = true } }

// ProbeRoute asks healthd (gantry.api.route.probe, from any machine) to
// probe route id now and answers with the result and the route's state; a
// failed probe is a result, not an error. The probe only reports: the
// route's state and probe schedule stay as they were, unless ApplyProbe
// says to record it. A route healthd does not probe is ErrNotFound; no
// healthd is ErrUnavailable. A probe may take healthd's probe timeout
// (10 s by default): give ctx a deadline beyond it.
func (c *Client) ProbeRoute(ctx context.Context, id string, opts ...ProbeOption) (RouteProbe, error) {
	if !wire.ValidToken(id) {
		return RouteProbe{}, fmt.Errorf("%w: route id %q: must be non-empty, without spaces, '.', '*' or '>'", ErrInvalid, id)
	}
	hint := fmt.Sprintf("no healthd answered on %s: start 'gantry run' or 'gantry healthd' with a config that has route %q", wire.SubjectRouteProbe, id)
	req := wire.RouteProbeRequest{ID: id}
	for _, o := range opts {
		o(&req)
	}
	var reply RouteProbe
	if err := c.request(ctx, wire.SubjectRouteProbe, hint, req, &reply); err != nil {
		return RouteProbe{}, fmt.Errorf("probe route %q: %w", id, err)
	}
	if reply.Result == nil || reply.Route == nil {
		return RouteProbe{}, fmt.Errorf("probe route %q: healthd answered without a result", id)
	}
	return reply, nil
}
