package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/internal/logging"
)

// app holds what every command shares: the global flags and the streams.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	client clientFlags
	// abort ends the command's context with a cause: a permission the
	// broker refused.
	abort     context.CancelCauseFunc
	json      bool
	logFormat string
	logLevel  string
}

// Run runs the gantry command line with args and returns the exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	ctx, a.abort = context.WithCancelCause(ctx)
	defer a.abort(nil)
	err := root.ExecuteContext(ctx)
	var perm *permissionError
	if err != nil && errors.As(context.Cause(ctx), &perm) {
		err = perm
	}
	code := exitCode(err)
	if err != nil {
		a.printError(err, code, slices.Contains(args, "--json") || slices.Contains(args, "--json=true"))
	}
	return code
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "gantry",
		Short: "A task pipeline on NATS JetStream for long-running desktop and plant-floor automation",
		Long: `gantry runs automation tasks with ack deadlines, retries with backoff,
resource leases and a full audit trail, on an embedded NATS JetStream broker.

Start everything in one process with 'gantry run'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError("%v", err) })
	// Every duration flag in its range (exit 2 naming it otherwise); then
	// the nats CLI's context fills the connection flags not given.
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if err := checkDurations(cmd, args); err != nil {
			return err
		}
		return a.client.applyContext()
	}
	pf := root.PersistentFlags()
	a.client.register(pf)
	pf.BoolVar(&a.json, "json", false, "print JSON instead of tables")
	pf.StringVar(&a.logFormat, "log-format", "auto", "log format: text, json, or auto (text on a terminal)")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")

	root.Version = readVersion().String()
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(
		a.runCommand(),
		a.brokerCommand(),
		a.versionCommand(),
		a.auditCommand(),
		a.auditdCommand(),
		a.healthdCommand(),
		a.routeCommand(),
		a.leaseCommand(),
		a.resourceCommand(),
		a.jobCommand(),
		a.schedulerCommand(),
		a.submitCommand(),
		a.taskCommand(),
		a.workerCommand(),
		a.backupCommand(),
		a.restoreCommand(),
		a.statsCommand(),
		a.queueCommand(),
		a.alertdCommand(),
		a.serviceCommand(),
		a.roleCommand(),
		a.uiCommand(),
		a.benchCommand(),
	)
	// 'gantry completion bash|zsh|fish|powershell', cobra's own, added now
	// so that the walk below covers it.
	root.InitDefaultCompletionCmd()
	requireSubcommands(root)
	return root
}

// requireSubcommands makes every command group (a command with
// subcommands and nothing to run itself) refuse to run bare or with an
// unknown subcommand: a usage error, exit 2, as kubectl and the nats CLI
// do; cobra would print the help and exit 0. Groups added later get the
// same.
func requireSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		requireSubcommands(c)
	}
	if !cmd.HasParent() || !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		var names []string
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() {
				names = append(names, c.Name())
			}
		}
		if len(args) == 0 {
			return usageError("%q needs a subcommand: %s (see '%s --help')", cmd.CommandPath(), strings.Join(names, ", "), cmd.CommandPath())
		}
		hint := ""
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			hint = fmt.Sprintf(" (did you mean %s?)", strings.Join(s, ", "))
		}
		return usageError("unknown command %q for %q%s: want one of %s", args[0], cmd.CommandPath(), hint, strings.Join(names, ", "))
	}
}

// logger builds the process's one logger from the global flags.
func (a *app) logger() (*slog.Logger, error) {
	w := a.stderr
	if w == nil {
		w = os.Stderr
	}
	log, err := logging.New(w, logging.Format(cmp.Or(a.logFormat, "auto")), a.logLevel)
	if err != nil {
		return nil, usageError("%v", err)
	}
	return log, nil
}

// exactArgs is cobra.ExactArgs with a usage exit code.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError("want %s, got %d argument(s)", names, len(args))
		}
		return nil
	}
}
