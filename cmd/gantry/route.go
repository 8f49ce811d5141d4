package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

func (a *app) routeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "route",
		Short: "Show egress routes and their health; probe one now",
		Long: `Egress routes are the proxies (or direct connections) http tasks go out
through. healthd probes each route of the config file and keeps its state
(AVAILABLE, COOLDOWN, FAULT, DISABLED), score and counters in the
gantry_routes bucket; an http task with "route": "auto" takes the
best-scoring AVAILABLE route. See 'gantry healthd --help' for the probes and
the score.`,
	}
	cmd.AddCommand(a.routeLsCommand(), a.routeProbeCommand())
	return cmd
}

// routeView is a route as the CLI prints it: the contract's fields always
// present, the proxy's password redacted.
type routeView struct {
	ID                   string          `json:"id"`
	State                wire.RouteState `json:"state"`
	Score                float64         `json:"score"`
	LatencyMS            int64           `json:"latency_ms"`
	ConsecutiveSuccesses int             `json:"consecutive_successes"`
	ConsecutiveFailures  int             `json:"consecutive_failures"`
	LastError            string          `json:"last_error"`
	CooldownUntil        *time.Time      `json:"cooldown_until"`
	LastChecked          *time.Time      `json:"last_checked"`
	Proxy                string          `json:"proxy"`
	RecentTimeouts       int             `json:"recent_timeouts"`
	LastErrorKind        wire.ErrorKind  `json:"last_error_kind"`
	CooldownStreak       int             `json:"cooldown_streak"`
}

func viewRoute(r wire.Route) routeView {
	return routeView{
		ID: r.ID, State: r.State, Score: r.Score, LatencyMS: r.LatencyMS,
		ConsecutiveSuccesses: r.ConsecutiveSuccesses, ConsecutiveFailures: r.ConsecutiveFailures,
		LastError: r.LastError, CooldownUntil: r.CooldownUntil, LastChecked: r.LastChecked,
		Proxy: wire.RedactProxy(cmp.Or(r.Proxy, wire.RouteDirect)), RecentTimeouts: r.RecentTimeouts,
		LastErrorKind: r.LastErrorKind, CooldownStreak: r.CooldownStreak,
	}
}

func (a *app) printRoutes(rs []wire.Route) error {
	views := make([]routeView, 0, len(rs))
	for _, r := range rs {
		views = append(views, viewRoute(r))
	}
	if a.json {
		return a.printJSON(views)
	}
	when := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.Local().Format(time.RFC3339)
	}
	rows := make([][]string, 0, len(views))
	for _, v := range views {
		rows = append(rows, []string{
			v.ID, string(v.State), strconv.FormatFloat(v.Score, 'f', 2, 64), strconv.FormatInt(v.LatencyMS, 10),
			strconv.Itoa(v.ConsecutiveSuccesses), strconv.Itoa(v.ConsecutiveFailures), strconv.Itoa(v.RecentTimeouts),
			when(v.CooldownUntil), when(v.LastChecked), v.Proxy, cmp.Or(v.LastError, "-"),
		})
	}
	return a.printTable([]string{"ID", "STATE", "SCORE", "LATENCY_MS", "OK", "FAILED", "TIMEOUTS", "COOLDOWN_UNTIL", "LAST_CHECKED", "PROXY", "LAST_ERROR"}, rows)
}

func (a *app) routeLsCommand() *cobra.Command {
	var p pageFlags
	cmd := &cobra.Command{
		Use:   "ls [--limit N | --all]",
		Short: "List the egress routes with their state, score and counters",
		Long: `Ls prints every route in gantry_routes. With --json it prints an array of
objects with id, state, score, latency_ms, consecutive_successes,
consecutive_failures, last_error, cooldown_until, last_checked, and also
proxy (password redacted), recent_timeouts, last_error_kind and
cooldown_streak.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-route", func(c *client.Client) error {
				rs, err := c.Routes(ctx)
				if err != nil {
					return err
				}
				return a.printRoutes(page(a, p, rs, "routes", false))
			})
		},
	}
	p.register(cmd.Flags(), "routes")
	return cmd
}

// probeWait is how long 'route probe' waits for healthd unless --timeout is
// given: a probe may take healthd's probe timeout (10s) and some.
const probeWait = 30 * time.Second

func (a *app) routeProbeCommand() *cobra.Command {
	var apply bool
	cmd := &cobra.Command{
		Use:   "probe ID [--apply]",
		Short: "Probe a route now, through healthd, and print the result",
		Long: `Probe asks healthd (over the gantry.api.route.probe service, so it works from
any machine) to probe route ID at once and prints the result with the
route's state. The probe only reports: the route's counters, cooldown and
probe schedule stay as they were. With --apply healthd records it like a
scheduled probe (a success ends a cooldown, a failure counts and may start
or lengthen one). It exits 0 when the probe succeeded, 1 when it failed or
no healthd answered, 4 when healthd has no route ID. It waits up to 30s
unless --timeout is given.`,
		Args: exactArgs(1, "a route id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			wait := probeWait
			if f := cmd.Flag("timeout"); f != nil && f.Changed {
				wait = a.client.timeout
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			return a.withClient(ctx, "gantry-route", func(c *client.Client) error {
				var opts []client.ProbeOption
				if apply {
					opts = append(opts, client.ApplyProbe())
				}
				probe, err := c.ProbeRoute(ctx, args[0], opts...)
				if err != nil {
					return err
				}
				if err := a.printProbe(probe); err != nil {
					return err
				}
				if res := probe.Result; !res.OK {
					return fmt.Errorf("probe of route %q failed at stage %s (%s): %s", args[0], res.Stage, res.Kind, res.Error)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "record the outcome like a scheduled probe (it may end or start a cooldown)")
	return cmd
}

func (a *app) printProbe(reply client.RouteProbe) error {
	res := *reply.Result
	if a.json {
		return a.printJSON(struct {
			Result wire.HealthResult `json:"result"`
			Route  routeView         `json:"route"`
		}{res, viewRoute(*reply.Route)})
	}
	outcome := "ok"
	if !res.OK {
		outcome = fmt.Sprintf("failed at %s: %s", res.Stage, res.Kind)
	}
	exit := "-"
	if res.ExitIP != "" || res.Region != "" {
		exit = cmp.Or(res.ExitIP, "?") + " " + res.Region
	}
	if err := a.printTable([]string{"PROBE", "LATENCY_MS", "EXIT", "ERROR"},
		[][]string{{outcome, strconv.FormatInt(res.LatencyMS, 10), exit, cmp.Or(res.Error, "-")}}); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout)
	return a.printRoutes([]wire.Route{*reply.Route})
}
