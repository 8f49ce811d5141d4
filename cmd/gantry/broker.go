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
other components connect to it with --server.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.broker(cmd.Context(), &sf) },
	}
	sf.register(cmd)
	return cmd
}

func (a *app) broker(ctx context.Context, sf *serverFlags) error {
	log, err := a.logger()
	if err != nil {
		return err
	}
	cfg, err := sf.loadConfig()
	if err != nil {
		return err
	}
	b, err := sf.startBroker(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer b.Shutdown()
	p := newProcess(log)
	p.attrs = append(p.attrs, "nats", b.ClientURL(), "data_dir", sf.dataDir)

	// Signals: SIGINT and SIGTERM stop the broker cleanly.
	p.addSignals(ctx)

	// HTTP: /healthz and /readyz.
	nc, _, err := p.connect(b, "http")
	if err != nil {
		return err
	}
	if err := p.addHTTP(sf.httpListen, nc); err != nil {
		return err
	}
	return p.run()
}
