// Package healthd keeps gantry's egress routes honest. For every route of
// the config file it runs a three-stage probe on the route's interval:
//
//  1. tcp: a TCP connect to the proxy (to the probe URL's host when the
//     route is direct);
//  2. request: a GET of the probe URL through the route (HTTP CONNECT or
//     SOCKS5), timed; a 4xx or 5xx answer is a failure;
//  3. exit: when the route has expect_ip or expect_region, a GET of the
//     expect URL through the route, whose reported IP and region must match.
//
// A failure is classified (refused, timeout, bad_status, wrong_exit, proxy,
// other). Each route keeps its last check, latency, consecutive successes
// and failures, recent timeouts and last error, and a score:
//
//	score = 100 − latency_ms/20 − 15·consecutive_failures − 10·recent_timeouts
//
// clamped to [0, 100]. A route whose score falls below the threshold goes
// to COOLDOWN for a while (longer each time it falls again without
// settling), is probed again when the cooldown ends and returns to
// AVAILABLE when that probe succeeds with a score at or above the
// threshold. Failures of real traffic that workers report on
// gantry.health.report.<route> count like failed probes.
//
// The state lives in the gantry_routes bucket (kv.RouteStore); every probe
// result is published on gantry.health.route.<route>; ROUTE_COOLDOWN and
// ROUTE_RECOVERED are audit events. `gantry route probe ID` asks for a probe
// now through the gantry.api.route.probe service. All time, except network
// deadlines, comes from the injected clock.
package healthd
