package main

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/lease"
)

func (a *app) resourceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resource",
		Short: "Register resources and move them through their states",
		Long: `Resources live in the gantry_resources bucket, each in one of the states
AVAILABLE, LEASED, RUNNING, COOLDOWN, FAULT and DISABLED. Tasks and 'gantry
lease' move them AVAILABLE -> LEASED -> RUNNING -> AVAILABLE (or COOLDOWN, or
FAULT on a resource failure); an operator can release (LEASED/RUNNING ->
AVAILABLE), disable, enable, and move FAULT -> AVAILABLE or DISABLED. Any other
move exits 2 naming from and to. DISABLED and FAULT resources cannot be leased.`,
	}
	cmd.AddCommand(
		a.resourceAddCommand(),
		a.resourceLsCommand(),
		a.resourceGetCommand(),
		a.resourceSetStateCommand(),
		a.resourceDisableCommand(),
		a.resourceEnableCommand(),
	)
	return cmd
}

// resourceJSON is a resource as `--json` prints it: every field of the
// contract, present even when empty, then how many wait in line for it and
// who, next first.
type resourceJSON struct {
	ID         string              `json:"id"`
	State      wire.ResourceState  `json:"state"`
	LeaseOwner string              `json:"lease_owner"`
	LeaseUntil *time.Time          `json:"lease_until"`
	RouteID    string              `json:"route_id"`
	LastError  string              `json:"last_error"`
	UpdatedAt  time.Time           `json:"updated_at"`
	Reclaim    lease.ReclaimPolicy `json:"reclaim"`
	Waiting    int                 `json:"waiting"`
	Waiters    []wire.Waiter       `json:"waiters"`
}

func toResourceJSON(r lease.Resource) resourceJSON {
	return resourceJSON{
		ID: r.ID, State: r.State, LeaseOwner: r.LeaseOwner, LeaseUntil: r.LeaseUntil,
		RouteID: r.RouteID, LastError: r.LastError, UpdatedAt: r.UpdatedAt, Reclaim: r.Reclaim,
		Waiting: len(r.Waiters), Waiters: append([]wire.Waiter{}, r.Waiters...),
	}
}

// printResources prints resources as a table, or a JSON array.
func (a *app) printResources(rs []lease.Resource) error {
	if a.json {
		out := make([]resourceJSON, 0, len(rs))
		for _, r := range rs {
			out = append(out, toResourceJSON(r))
		}
		return a.printJSON(out)
	}
	rows := make([][]string, 0, len(rs))
	for _, r := range rs {
		until := "-"
		if r.LeaseUntil != nil {
			until = r.LeaseUntil.Local().Format(time.RFC3339)
		}
		rows = append(rows, []string{r.ID, string(r.State), dash(r.LeaseOwner), until, strconv.Itoa(len(r.Waiters)), dash(r.RouteID), dash(r.LastError), r.UpdatedAt.Local().Format(time.RFC3339)})
	}
	return a.printTable([]string{"ID", "STATE", "LEASE_OWNER", "LEASE_UNTIL", "WAITING", "ROUTE", "LAST_ERROR", "UPDATED"}, rows)
}

// printResource prints one resource, as a JSON object with --json.
func (a *app) printResource(r lease.Resource) error {
	if a.json {
		return a.printJSON(toResourceJSON(r))
	}
	return a.printResources([]lease.Resource{r})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// resourceOp runs op on a client and prints the resource it returns.
func (a *app) resourceOp(ctx context.Context, op func(*client.Client) (lease.Resource, error)) error {
	return a.withClient(ctx, "gantry-resource", func(c *client.Client) error {
		res, err := op(c)
		if err != nil {
			return err
		}
		return a.printResource(res)
	})
}

func (a *app) resourceAddCommand() *cobra.Command {
	var route, reclaim string
	var force bool
	cmd := &cobra.Command{
		Use:   "add ID [--route R [--force]] [--reclaim available|fault]",
		Short: "Register a resource (idempotent: an existing one keeps its state)",
		Long: `Add registers resource ID as AVAILABLE. Adding an existing resource keeps its
state and sets its route and reclaim policy. --reclaim says where the resource
goes when it is found RUNNING after its holder's lease vanished (a crash):
available (default) or fault (for an operator to check first).

--route must name a route of gantry_routes ('gantry route ls': healthd
registers the routes of its config); another exits 2, unless --force
registers the resource with it anyway (a route healthd will know later).`,
		Args: exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			policy, err := lease.ParseReclaimPolicy(reclaim)
			if err != nil {
				return usageError("%v", err)
			}
			ctx := cmd.Context()
			return a.resourceOp(ctx, func(c *client.Client) (lease.Resource, error) {
				if route != "" && !force {
					if err := checkRoute(ctx, c, route); err != nil {
						return lease.Resource{}, err
					}
				}
				return c.AddResource(ctx, lease.ResourceSpec{ID: args[0], Route: route, Reclaim: policy})
			})
		},
	}
	cmd.Flags().StringVar(&route, "route", "", "egress route the resource goes out through (one of 'gantry route ls')")
	cmd.Flags().BoolVar(&force, "force", false, "register the resource even if --route names no known route")
	cmd.Flags().StringVar(&reclaim, "reclaim", "available", "state after a crash while RUNNING: available or fault")
	return cmd
}

func (a *app) resourceLsCommand() *cobra.Command {
	var p pageFlags
	cmd := &cobra.Command{
		Use:   "ls [--limit N | --all]",
		Short: "List resources and their states",
		Long: `Ls lists every resource: its state, its holder with the live expiry of the
holder's lease, and how many wait in line for it (tasks, 'lease acquire|run
--wait'). With --json it prints an array of objects with id, state,
lease_owner, lease_until, route_id, last_error, updated_at, reclaim, waiting
and waiters (the line, next first: owner, task_id, priority, arrived, ...).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-resource", func(c *client.Client) error {
				rs, err := c.Resources(ctx)
				if err != nil {
					return err
				}
				return a.printResources(page(a, p, rs, "resources", false))
			})
		},
	}
	p.register(cmd.Flags(), "resources")
	return cmd
}

func (a *app) resourceGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one resource and its line (exit 4 if unknown)",
		Long: `Get shows resource ID as ls does: its state, its holder with the live
expiry of the holder's lease, how many wait in line for it, and with --json
who (waiters, next first).`,
		Args: exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.resourceOp(ctx, func(c *client.Client) (lease.Resource, error) { return c.Resource(ctx, args[0]) })
		},
	}
}

func (a *app) resourceSetStateCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "set-state ID STATE --reason TEXT",
		Short: "Move a resource to a state (exit 2 on an illegal move, 4 if unknown)",
		Long: `Set-state moves resource ID to STATE (AVAILABLE, FAULT or DISABLED), recording
the reason in the audit trail. A move the state machine does not allow, and
moves to LEASED, RUNNING or COOLDOWN (which only a lease holder makes), exit 2
naming from and to. Moving a leased resource to AVAILABLE leaves the lease
itself to its holder.`,
		Args: exactArgs(2, "a resource id and a state"),
		RunE: func(cmd *cobra.Command, args []string) error {
			to, err := wire.ParseResourceState(args[1])
			if err != nil {
				return usageError("%v", err)
			}
			if reason == "" {
				return usageError("--reason is required: say why, for the audit trail (e.g. --reason \"camera replaced\")")
			}
			ctx := cmd.Context()
			return a.resourceOp(ctx, func(c *client.Client) (lease.Resource, error) {
				return c.SetResourceState(ctx, args[0], to, reason)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; goes into the audit event)")
	return cmd
}

func (a *app) resourceDisableCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "disable ID [--reason TEXT]",
		Short: "Take a resource out of service: it cannot be leased until enabled",
		Long: `Disable moves resource ID to DISABLED from any state. A holder already running
on it keeps its lease until it finishes; the resource then stays DISABLED.`,
		Args: exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.resourceOp(ctx, func(c *client.Client) (lease.Resource, error) {
				return c.DisableResource(ctx, args[0], reason)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (goes into the audit event)")
	return cmd
}

func (a *app) resourceEnableCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "enable ID [--reason TEXT]",
		Short: "Return a DISABLED or FAULT resource to AVAILABLE",
		Args:  exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.resourceOp(ctx, func(c *client.Client) (lease.Resource, error) {
				return c.EnableResource(ctx, args[0], reason)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (goes into the audit event)")
	return cmd
}

// checkRoute refuses a route gantry_routes does not hold (exit 2).
func checkRoute(ctx context.Context, c *client.Client, id string) error {
	routes, err := c.Routes(ctx)
	if err != nil {
		return err
	}
	known := make([]string, 0, len(routes))
	for _, r := range routes {
		if r.ID == id {
			return nil
		}
		known = append(known, r.ID)
	}
	have := "there are none"
	if len(known) > 0 {
		have = "known: " + strings.Join(known, ", ")
	}
	return usageError("--route %q: no such egress route (%s); healthd registers the routes of its config ('gantry route ls'), or add --force", id, have)
}

// resourceSpecs turns the config file's resources into what the keeper
// registers at start.
func resourceSpecs(cfg *config.File) []lease.ResourceSpec {
	specs := make([]lease.ResourceSpec, 0, len(cfg.Resources))
	for _, r := range cfg.Resources {
		specs = append(specs, lease.ResourceSpec{ID: r.ID, Route: r.Route, Reclaim: lease.ReclaimPolicy(r.Reclaim)})
	}
	return specs
}
