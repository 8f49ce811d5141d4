package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker"
)

func (a *app) roleCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "role show|creds ROLE",
		Short: "Print the subjects a role may publish and subscribe to, or mint a creds file of a role",
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
	var (
		name, seed, out string
		expires         time.Duration
	)
	creds := &cobra.Command{
		Use:   "creds ROLE --name NAME --account-seed FILE [--expires D] [--out FILE]",
		Short: "Mint a creds file of a role, for a broker in operator mode (auth.operator)",
		Long: `Creds signs a user JWT named NAME with the permissions of ROLE, with the
account seed of the broker's auth.operator section, and writes it with the
user's seed as a creds file (to --out, or standard output): the user then
connects with --creds FILE.`,
		Args: exactArgs(1, "ROLE"),
		RunE: func(_ *cobra.Command, args []string) error {
			r, err := broker.ParseRole(args[0])
			if err != nil {
				return usageError("%v", err)
			}
			if name == "" || seed == "" || expires < 0 {
				return usageError("want --name, --account-seed, and --expires of 0 (never) or more")
			}
			data, err := broker.MintCreds(r, name, seed, expires)
			if err != nil {
				return err
			}
			if out == "" {
				_, err = a.stdout.Write(data)
				return err
			}
			return os.WriteFile(out, data, 0o600)
		},
	}
	creds.Flags().StringVar(&name, "name", "", "the user's name")
	creds.Flags().StringVar(&seed, "account-seed", "", "the account's seed file (auth.operator.account_seed)")
	creds.Flags().DurationVar(&expires, "expires", 0, "how long the creds are valid (0: no expiry)")
	creds.Flags().StringVar(&out, "out", "", "write the creds file here (mode 0600) instead of standard output")
	cmd.AddCommand(creds)
	return cmd
}

func roleNames() string {
	var names []string
	for _, r := range broker.Roles {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}
