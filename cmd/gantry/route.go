package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
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
	return &cobra.Command{
		Use:   "ls",
		Short: "List the egress routes with their state, score and counters",
		Long: `Ls prints every route in gantry_routes. With --json it prints an array of
objects with id, state, score, latency_ms, consecutive_successes,
consecutive_failures, last_error, cooldown_until, last_checked, and also
proxy (password redacted), recent_timeouts, last_error_kind and
cooldown_streak.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, js, err := a.client.connect("gantry-route")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), a.client.timeout)
			defer cancel()
			store, err := egress.NewStore(ctx, js)
			if err != nil {
				return err
			}
			rs, err := store.List(ctx)
			if err != nil {
				return err
			}
			return a.printRoutes(rs)
		},
	}
}

// probeWait is how long 'route probe' waits for healthd unless --timeout is
// given: a probe may take healthd's probe timeout (10s) and some.
const probeWait = 30 * time.Second

func (a *app) routeProbeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "probe ID",
		Short: "Probe a route now, through healthd, and print the result",
		Long: `Probe asks healthd (over the gantry.api.route.probe service, so it works from
any machine) to probe route ID at once, records the result like any probe
(a success ends a cooldown) and prints it with the route's new state. It
exits 0 when the probe succeeded, 1 when it failed or no healthd answered,
4 when healthd has no route ID. It waits up to 30s unless --timeout is given.`,
		Args: exactArgs(1, "a route id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if !wire.ValidToken(id) {
				return usageError("route id %q: must be non-empty, without spaces, '.', '*' or '>'", id)
			}
			wait := probeWait
			if f := cmd.Flag("timeout"); f != nil && f.Changed {
				wait = a.client.timeout
			}
			nc, _, err := a.client.connect("gantry-route")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			data, err := json.Marshal(wire.RouteProbeRequest{ID: id})
			if err != nil {
				return err
			}
			msg, err := nc.RequestWithContext(ctx, wire.SubjectRouteProbe, data)
			if errors.Is(err, nats.ErrNoResponders) {
				return fmt.Errorf("no healthd answered on %s: start 'gantry run' or 'gantry healthd' with a config that has route %q", wire.SubjectRouteProbe, id)
			}
			if err != nil {
				return fmt.Errorf("probe route %q: %w", id, err)
			}
			var reply wire.RouteProbeReply
			if err := json.Unmarshal(msg.Data, &reply); err != nil {
				return fmt.Errorf("probe route %q: bad reply: %w", id, err)
			}
			switch {
			case reply.NotFound:
				return withCode(exitNotFound, errors.New(reply.Error))
			case reply.Error != "" || reply.Result == nil || reply.Route == nil:
				return fmt.Errorf("probe route %q: %s", id, cmp.Or(reply.Error, "empty reply"))
			}
			if err := a.printProbe(reply); err != nil {
				return err
			}
			if res := reply.Result; !res.OK {
				return fmt.Errorf("probe of route %q failed at stage %s (%s): %s", id, res.Stage, res.Kind, res.Error)
			}
			return nil
		},
	}
}

func (a *app) printProbe(reply wire.RouteProbeReply) error {
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
