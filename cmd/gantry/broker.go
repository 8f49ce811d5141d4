package main

import (
	"context"

	"github.com/spf13/cobra"
)

func (a *app) brokerCommand() *cobra.Command {
	var sf serverFlags
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Run the embedded NATS JetStream broker alone",
		Long: `Broker runs only the embedded NATS JetStream broker, with every stream and
bucket gantry needs provisioned, for a system split across machines: the
other components connect to it with --server.

Of the config file it uses the auth section; it names, in its log, the
process that uses each other section (resources: 'gantry worker', whose
keeper registers them; jobs: 'gantry scheduler'; routes: 'gantry healthd').`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.broker(cmd.Context(), &sf) },
	}
	sf.register(cmd)
	return cmd
}

func (a *app) broker(ctx context.Context, sf *serverFlags) error {
	return a.serve(ctx, sf, []string{"auth"}, nil)
}
