package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/lease"
)

// defaultLeaseTTL is the TTL of a lease taken from the command line.
const defaultLeaseTTL = 30 * time.Second

// exitLeaseLost is lease run's exit code when its lease was lost while CMD
// ran (it lapsed or someone else took the resource): the contract's code
// for a resource held by another owner.
const exitLeaseLost = exitConflict

func (a *app) leaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Take, renew, release and list resource leases; run a command under one",
		Long: `A lease is an exclusive claim on a resource (a desktop application, a browser
profile, a camera, a serial device) in the gantry_leases bucket. The broker
expires it after its TTL unless its holder renews it; a lease held by another
owner is never renewed, released or taken over (exit 3, naming the holder and
its expiry).

If the resource is registered ('gantry resource add', or the config file), a
lease also moves it AVAILABLE -> LEASED and its release back to AVAILABLE; a
DISABLED or FAULT resource cannot be leased. An unregistered id gets a plain
lease.`,
	}
	cmd.AddCommand(
		a.leaseAcquireCommand(),
		a.leaseRenewCommand(),
		a.leaseReleaseCommand(),
		a.leaseLsCommand(),
		a.leaseRunCommand(),
	)
	return cmd
}

// withLeases runs fn on a client after checking owner, which every lease
// command but ls and run requires.
func (a *app) withLeases(ctx context.Context, owner string, fn func(*client.Client) error) error {
	if err := checkOwner(owner); err != nil {
		return err
	}
	return a.withClient(ctx, "gantry-lease", fn)
}

// printLease prints one lease.
func (a *app) printLease(l wire.Lease) error {
	if a.json {
		return a.printJSON(l)
	}
	return a.printLeases([]wire.Lease{l})
}

func (a *app) printLeases(ls []wire.Lease) error {
	rows := make([][]string, 0, len(ls))
	for _, l := range ls {
		rows = append(rows, []string{l.Resource, l.Owner, l.ExpiresAt.Local().Format(time.RFC3339), strconv.FormatUint(l.Revision, 10)})
	}
	return a.printTable([]string{"RESOURCE", "OWNER", "EXPIRES", "REVISION"}, rows)
}

func (a *app) leaseAcquireCommand() *cobra.Command {
	var owner string
	var ttl time.Duration
	var wait waitFlags
	cmd := &cobra.Command{
		Use:   "acquire RES --owner O [--ttl D] [--wait[=TIMEOUT]]",
		Short: "Take the lease on a resource (exit 3 if another owner holds it)",
		Long: `Acquire takes the lease on RES for owner O, for --ttl (whole seconds, at
least 1 s). It does not renew it: renew it with 'gantry lease renew' before it
lapses, or release it with 'gantry lease release'. If another owner holds RES,
it exits 3 naming the holder and its expiry, and changes nothing. If O already
holds it, the lease is renewed.

With --wait, if RES is held, cooling down, DISABLED or FAULT, acquire waits in
RES's line (the line tasks wait in) and takes the lease the moment its turn
comes; meanwhile it says on stderr who holds RES, until when, and its place in
line. --wait=TIMEOUT gives up after TIMEOUT and exits 3, like flock -w.`,
		Args: exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withLeases(ctx, owner, func(c *client.Client) error {
				wctx, opts, inLine := a.waitInLine(ctx, &wait)
				l, err := c.AcquireLease(wctx, args[0], owner, ttl, opts...)
				inLine()
				if err != nil {
					return err
				}
				return a.printLease(l)
			})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "who holds the lease (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", defaultLeaseTTL, "how long the lease lasts unless renewed")
	wait.register(cmd.Flags())
	return cmd
}

// checkOwner refuses a lease command without --owner.
func checkOwner(owner string) error {
	if owner == "" {
		return usageError("--owner is required: name who holds the lease (e.g. --owner $HOSTNAME/backup)")
	}
	return nil
}

func (a *app) leaseRenewCommand() *cobra.Command {
	var owner string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "renew RES --owner O [--ttl D]",
		Short: "Renew a lease you hold (exit 3 if another owner holds it, 4 if nobody does)",
		Long: `Renew restarts the TTL of O's lease on RES (with --ttl, a new TTL; otherwise
the one it was taken with). A lease held by another owner is never renewed:
exit 3 naming the holder. No lease on RES (it lapsed or was released): exit 4.`,
		Args: exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withLeases(ctx, owner, func(c *client.Client) error {
				renewed, err := c.RenewLease(ctx, args[0], owner, ttl)
				if err != nil {
					return err
				}
				return a.printLease(renewed)
			})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "who holds the lease (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "new TTL (default: the lease's own)")
	return cmd
}

func (a *app) leaseReleaseCommand() *cobra.Command {
	var owner string
	cmd := &cobra.Command{
		Use:   "release RES --owner O",
		Short: "Release a lease you hold (exit 3 if another owner holds it, 4 if nobody does)",
		Long: `Release gives up O's lease on RES; a registered resource returns to
AVAILABLE. A lease held by another owner is never released: exit 3 naming the
holder. No lease on RES: exit 4.`,
		Args: exactArgs(1, "a resource id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return a.withLeases(ctx, owner, func(c *client.Client) error {
				return c.ReleaseLease(ctx, args[0], owner)
			})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "who holds the lease (required)")
	return cmd
}

func (a *app) leaseLsCommand() *cobra.Command {
	var p pageFlags
	cmd := &cobra.Command{
		Use:   "ls [--limit N | --all]",
		Short: "List the current leases",
		Long: `Ls lists every live lease. With --json it prints an array of objects with
resource, owner, expires_at and revision.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			return a.withClient(ctx, "gantry-lease", func(c *client.Client) error {
				ls, err := c.Leases(ctx)
				if err != nil {
					return err
				}
				ls = page(a, p, ls, "leases", false)
				if a.json {
					return a.printJSON(ls)
				}
				return a.printLeases(ls)
			})
		},
	}
	p.register(cmd.Flags(), "leases")
	return cmd
}

func (a *app) leaseRunCommand() *cobra.Command {
	var owner string
	var ttl time.Duration
	var wait waitFlags
	cmd := &cobra.Command{
		Use:   "run RES [--owner O] [--ttl D] [--wait[=TIMEOUT]] -- CMD [ARGS...]",
		Short: "Run a command while holding the lease on a resource",
		Long: `Run checks and acquires the lease on RES, starts CMD, renews the lease every
TTL/3 while CMD runs, releases it when CMD ends and exits with CMD's exit code.

- If another owner holds RES (or RES is cooling down), it exits 3 without
  starting CMD, naming the holder and its expiry. A DISABLED or FAULT resource
  is refused with exit 1.
- With --wait, it waits in RES's line instead (the line tasks wait in), saying
  on stderr who holds RES, until when, and its place in line, and starts CMD
  the moment its turn comes. --wait=TIMEOUT gives up after TIMEOUT and exits
  3 without starting CMD, like flock -w.
- If CMD cannot start, it exits 127 (not found) or 126 (not executable), like
  a shell, and releases the lease: the resource moves to RUNNING only once
  CMD has started.
- SIGINT and SIGTERM are forwarded to CMD's process tree; gantry waits for
  CMD to end.
- If the lease is lost while CMD runs (renewals fail for 2/3 of the TTL, or
  the lease was taken away), CMD's whole process tree is killed and gantry
  exits 3 saying so. It exits 3 too when CMD ended after the lease was lost
  (gantry itself was stopped past the TTL), whatever CMD's code: its work
  was not guarded by the lease.
- When CMD ends, whatever it left running is killed before the lease is
  released: on Linux everything it started, setsid or double-forked too (a
  cgroup or a subreaper holds the tree); its process group on macOS; its Job
  Object on Windows.
- CMD finds the resource in GANTRY_RESOURCE, the owner in
  GANTRY_LEASE_OWNER and the lease's revision in GANTRY_LEASE_REVISION: a
  fencing token, higher for every later holder, to pass to what it writes
  so that a writer that lost the lease can be refused. A non-zero exit of CMD is a task failure, not a
  resource fault: the resource returns to AVAILABLE.

--owner defaults to <host>/<pid>.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return usageError("want RES -- CMD [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if owner == "" {
				host, _ := os.Hostname()
				owner = fmt.Sprintf("%s/%d", host, os.Getpid())
			}
			return a.leaseRun(cmd.Context(), args[0], owner, ttl, &wait, args[1:])
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "who holds the lease (default <host>/<pid>)")
	cmd.Flags().DurationVar(&ttl, "ttl", defaultLeaseTTL, "lease TTL; renewed every TTL/3")
	wait.register(cmd.Flags())
	return cmd
}

func (a *app) leaseRun(ctx context.Context, resource, owner string, ttl time.Duration, wait *waitFlags, argv []string) error {
	trees, err := proctree.New(proctree.Config{Shim: shimPath()})
	if err != nil {
		return err
	}
	cl, err := a.connect(ctx, "gantry-lease")
	if err != nil {
		return err
	}
	defer a.closeClient(cl)
	wctx, opts, inLine := a.waitInLine(ctx, wait)
	rh, err := cl.HoldLease(wctx, resource, owner, ttl, opts...)
	inLine()
	if err != nil {
		return err
	}
	finish := func() error {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return rh.Finish(fctx, lease.Outcome{})
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdin, c.Stdout, c.Stderr = a.stdin, a.stdout, a.stderr
	// The lease's revision is a fencing token: a later holder's is higher,
	// so what CMD writes to can refuse a writer that lost the lease.
	c.Env = append(os.Environ(), wire.EnvResource+"="+resource, "GANTRY_LEASE_OWNER="+owner,
		wire.EnvLeaseRevision+"="+strconv.FormatUint(rh.Lease().Revision, 10))
	// Output still held by a process that escaped CMD's tree is cut off a
	// second after CMD ends.
	c.WaitDelay = time.Second
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, proctree.Interrupts()...)
	defer signal.Stop(sigs)
	// CMD starts before the resource moves to RUNNING: a command that
	// cannot start never marks it so, and its lease is released
	// (LEASED -> AVAILABLE).
	tree, err := trees.Start(c)
	if err != nil {
		return errors.Join(startExit(err), finish())
	}
	if err := rh.Start(ctx); err != nil {
		// The resource cannot run: CMD is stopped before it acts on it.
		_ = tree.Kill()
		_ = tree.Wait()
		return errors.Join(err, finish())
	}
	// Wait kills what CMD left running before it returns: nothing CMD
	// started may act on the resource once the lease is gone.
	waited := make(chan error, 1)
	go func() { waited <- tree.Wait() }()
	for {
		select {
		case s := <-sigs:
			if err := tree.Signal(s); err != nil && !errors.Is(err, os.ErrProcessDone) {
				fmt.Fprintf(a.stderr, "gantry: forward %v to %s: %v\n", s, argv[0], err)
			}
		case <-rh.Context().Done():
			killErr := tree.Kill()
			if errors.Is(killErr, os.ErrProcessDone) {
				killErr = nil
			}
			<-waited
			cause := context.Cause(rh.Context())
			if !errors.Is(cause, lease.ErrLost) {
				// Our own context ended: stop the command, release.
				return errors.Join(withCode(exitFailure, fmt.Errorf("%s stopped: %w", argv[0], cause)), killErr, finish())
			}
			lost := fmt.Errorf("lease on %s lost while %s ran (%v): killed its process tree", resource, argv[0], cause)
			return withCode(exitLeaseLost, errors.Join(lost, killErr))
		case err := <-waited:
			if ferr := finish(); errors.Is(ferr, lease.ErrLost) {
				// The lease lapsed before CMD ended (gantry itself was
				// stopped, say): CMD's result cannot be trusted as done
				// under the lease, whatever its code.
				return withCode(exitLeaseLost, fmt.Errorf("lease on %s lost before %s ended (%v): its work was not guarded by the lease", resource, argv[0], ferr))
			} else if ferr != nil {
				fmt.Fprintf(a.stderr, "gantry: release %s: %v\n", resource, ferr)
			}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code := proctree.ExitStatus(ee.ProcessState)
				return withCode(code, fmt.Errorf("%s exited with code %d", argv[0], code))
			}
			if err != nil {
				return withCode(exitFailure, fmt.Errorf("wait for %s: %w", argv[0], err))
			}
			return nil
		}
	}
}

// The exit codes of a command that cannot start, as a shell's.
const (
	exitNotExecutable   = 126
	exitCommandNotFound = 127
)

// startExit maps a command that could not start to a shell's exit code:
// 127 not found, 126 not executable, 1 otherwise.
func startExit(err error) error {
	switch {
	case errors.Is(err, proctree.ErrNotFound):
		return withCode(exitCommandNotFound, err)
	case errors.Is(err, proctree.ErrNotExecutable):
		return withCode(exitNotExecutable, err)
	}
	return withCode(exitFailure, fmt.Errorf("start: %w", err))
}
