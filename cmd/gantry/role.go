package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker"
)

func (a *app) roleCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "role show ROLE",
		Short: "Print the subjects a role may publish and subscribe to",
		Long: `Role prints what a user of a role (auth.users[].role in the config file) may
publish and subscribe to, subject by subject: what the embedded broker
enforces, and what to give a user of the same role in a NATS system you run
yourself (nsc add user --allow-pub ... --allow-sub ...). Roles: ` + roleNames() + `.
See docs/deployment.md#permissions.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "show ROLE",
		Short: "Print a role's permissions",
		Args:  exactArgs(1, "ROLE"),
		RunE: func(_ *cobra.Command, args []string) error {
			r, err := broker.ParseRole(args[0])
			if err != nil {
				return usageError("%v", err)
			}
			p, err := broker.RolePermissions(r)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"role": r, "publish_allow": p.PublishAllow, "publish_deny": p.PublishDeny,
					"subscribe_allow": p.SubscribeAllow, "subscribe_deny": p.SubscribeDeny, "responses": p.Responses})
			}
			for _, l := range []struct {
				name string
				subs []string
			}{{"publish allow", p.PublishAllow}, {"publish deny", p.PublishDeny}, {"subscribe allow", p.SubscribeAllow}, {"subscribe deny", p.SubscribeDeny}} {
				for _, s := range l.subs {
					fmt.Fprintf(a.stdout, "%-16s %s\n", l.name, s)
				}
			}
			if p.Responses {
				fmt.Fprintf(a.stdout, "%-16s %s\n", "responses", "may answer the requests it receives")
			}
			return nil
		},
	})
	return cmd
}

func roleNames() string {
	var names []string
	for _, r := range broker.Roles {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}
