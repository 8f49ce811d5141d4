package main

import (
	"cmp"
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit are set by the Makefile from git
// (-ldflags "-X main.version=... -X main.commit=..."); a build without them
// reads the module's build information instead.
var (
	version string
	commit  string
)

// buildVersion is what 'gantry version' reports.
type buildVersion struct {
	Gantry     string `json:"gantry"`
	Commit     string `json:"commit"`
	Go         string `json:"go"`
	NATSServer string `json:"nats-server"`
	NATSGo     string `json:"nats.go"`
}

// readVersion returns the version the linker set, or the module's build
// information: its version ("(devel)" for a build from a checkout) and VCS
// revision.
func readVersion() buildVersion {
	v := buildVersion{Gantry: version, Commit: commit}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		v.Gantry, v.Commit = cmp.Or(v.Gantry, "unknown"), cmp.Or(v.Commit, "unknown")
		return v
	}
	v.Go = info.GoVersion
	v.Gantry = cmp.Or(v.Gantry, info.Main.Version, "unknown")
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && v.Commit == "" {
			v.Commit = s.Value
		}
	}
	v.Commit = cmp.Or(v.Commit, "unknown")
	for _, d := range info.Deps {
		switch d.Path {
		case "github.com/nats-io/nats-server/v2":
			v.NATSServer = d.Version
		case "github.com/nats-io/nats.go":
			v.NATSGo = d.Version
		}
	}
	return v
}

// String is the one-line form of 'gantry version' and 'gantry --version'.
func (v buildVersion) String() string {
	return fmt.Sprintf("gantry %s (commit %s; %s, nats-server %s, nats.go %s)", v.Gantry, v.Commit, v.Go, v.NATSServer, v.NATSGo)
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print gantry's version, commit and the versions it is built with",
		Long: `Version prints gantry's module version and commit (set from git by 'make
build', read from the binary's build information otherwise) and the Go,
nats-server and nats.go versions it is built with. 'gantry --version' prints
the same line.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(*cobra.Command, []string) error {
			v := readVersion()
			if a.json {
				return a.printJSON(v)
			}
			_, err := fmt.Fprintln(a.stdout, v)
			return err
		},
	}
}
