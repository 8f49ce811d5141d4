package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// gantryVersion is this binary's module version ("(devel)" for a build in
// a checkout), as workers report it in gantry_workers.
func gantryVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "dev"
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print gantry's version and the versions it is built with",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			info, ok := debug.ReadBuildInfo()
			if !ok {
				return fmt.Errorf("no build information in this binary")
			}
			deps := map[string]string{}
			for _, d := range info.Deps {
				deps[d.Path] = d.Version
			}
			v := map[string]string{
				"gantry":      info.Main.Version,
				"go":          info.GoVersion,
				"nats-server": deps["github.com/nats-io/nats-server/v2"],
				"nats.go":     deps["github.com/nats-io/nats.go"],
			}
			if a.json {
				return a.printJSON(v)
			}
			_, err := fmt.Fprintf(a.stdout, "gantry %s (%s, nats-server %s, nats.go %s)\n", v["gantry"], v["go"], v["nats-server"], v["nats.go"])
			return err
		},
	}
}
