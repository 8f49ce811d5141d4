package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// serviceSpec is what 'gantry service install' installs: a service that
// runs gantry with Args.
type serviceSpec struct {
	// Name names the service (systemd unit, launchd label suffix, Windows
	// service name).
	Name string
	// Exe is the absolute path of the gantry binary.
	Exe string
	// Args are gantry's arguments: "run --config FILE", or one component.
	Args []string
	// LogFile, when set, receives the log (on Windows and macOS, where
	// nothing else collects stderr, it defaults to one).
	LogFile string
}

// description is the service's one-line description.
func (s serviceSpec) description() string {
	return "gantry task pipeline: gantry " + strings.Join(s.Args, " ")
}

// serviceStopTimeout is how long a service manager waits for gantry to stop
// before it kills it: gantry stops within 10 s.
const serviceStopTimeout = 15 * time.Second

// systemdUnit renders the systemd unit of s.
func systemdUnit(s serviceSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[Unit]\nDescription=%s\n", s.description())
	b.WriteString("Documentation=https://github.com/gantry-dev/gantry/blob/main/docs/deployment.md\n")
	b.WriteString("After=network-online.target\nWants=network-online.target\n\n")
	b.WriteString("[Service]\nType=simple\n")
	fmt.Fprintf(&b, "ExecStart=%s\n", systemdCommand(append([]string{s.Exe}, s.Args...)))
	b.WriteString("Restart=on-failure\nRestartSec=5s\nKillSignal=SIGTERM\n")
	fmt.Fprintf(&b, "TimeoutStopSec=%ds\n", int(serviceStopTimeout/time.Second))
	b.WriteString("LimitNOFILE=65536\n")
	if s.LogFile != "" {
		fmt.Fprintf(&b, "StandardOutput=append:%s\nStandardError=append:%s\n", s.LogFile, s.LogFile)
	}
	b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
	return b.String()
}

// systemdCommand quotes a command line as systemd's ExecStart reads it.
func systemdCommand(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		a = strings.ReplaceAll(a, "%", "%%")
		if a == "" || strings.ContainsAny(a, " \t\"'\\;$") {
			a = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", "$$").Replace(a) + `"`
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// launchdLabel is the launchd label of the service named name.
func launchdLabel(name string) string { return "dev.gantry." + name }

// launchdPlist renders the launchd property list of s.
func launchdPlist(s serviceSpec) string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
`)
	fmt.Fprintf(&b, "\t<key>Label</key>\n\t<string>%s</string>\n", xmlEscape(launchdLabel(s.Name)))
	b.WriteString("\t<key>ProgramArguments</key>\n\t<array>\n")
	for _, a := range append([]string{s.Exe}, s.Args...) {
		fmt.Fprintf(&b, "\t\t<string>%s</string>\n", xmlEscape(a))
	}
	b.WriteString("\t</array>\n")
	b.WriteString("\t<key>RunAtLoad</key>\n\t<true/>\n")
	b.WriteString("\t<key>KeepAlive</key>\n\t<dict>\n\t\t<key>SuccessfulExit</key>\n\t\t<false/>\n\t</dict>\n")
	fmt.Fprintf(&b, "\t<key>ExitTimeOut</key>\n\t<integer>%d</integer>\n", int(serviceStopTimeout/time.Second))
	if s.LogFile != "" {
		fmt.Fprintf(&b, "\t<key>StandardOutPath</key>\n\t<string>%s</string>\n", xmlEscape(s.LogFile))
		fmt.Fprintf(&b, "\t<key>StandardErrorPath</key>\n\t<string>%s</string>\n", xmlEscape(s.LogFile))
	}
	b.WriteString("</dict>\n</plist>\n")
	return b.String()
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;").Replace(s)
}

// windowsService is how the Windows Service Control Manager is told to run
// s: the service process is 'gantry service run', which answers the SCM,
// writes the log to LogFile and reports starts, stops and failures to the
// event log under the service's name.
type windowsService struct {
	Name, DisplayName, Description string
	Exe                            string
	Args                           []string
	// StartAutomatic starts the service at boot.
	StartAutomatic bool
	// RestartDelays are the recovery actions: restart after each delay,
	// on the first, second and later failures.
	RestartDelays []time.Duration
	// ResetPeriod is after how long without failure the count restarts.
	ResetPeriod time.Duration
}

// windowsServiceOf returns the Windows service of s.
func windowsServiceOf(s serviceSpec) windowsService {
	args := []string{"service", "run", "--name", s.Name}
	if s.LogFile != "" {
		args = append(args, "--log-file", s.LogFile)
	}
	return windowsService{
		Name: s.Name, DisplayName: "gantry (" + s.Name + ")", Description: s.description(),
		Exe: s.Exe, Args: append(append(args, "--"), s.Args...), StartAutomatic: true,
		RestartDelays: []time.Duration{5 * time.Second, 30 * time.Second, time.Minute}, ResetPeriod: 24 * time.Hour,
	}
}

// defaultServiceLog is where a service's log goes on systems where nothing
// collects a service's stderr: Windows and macOS.
func defaultServiceLog(name string) string {
	switch runtime.GOOS {
	case "windows":
		return filepath.Join(cmp.Or(os.Getenv("ProgramData"), `C:\ProgramData`), "gantry", name+".log")
	case "darwin":
		return filepath.Join("/Library/Logs", "gantry", name+".log")
	}
	return ""
}

// serviceManager installs and controls services on this system: systemd,
// launchd or the Windows SCM.
type serviceManager interface {
	install(s serviceSpec) error
	uninstall(name string) error
	start(name string) error
	stop(name string) error
	status(name string) (string, error)
}

// errNoServiceManager is the error on a system gantry cannot install
// services on.
var errNoServiceManager = errors.New("gantry service supports systemd (Linux), launchd (macOS) and the Windows Service Control Manager")

func (a *app) serviceCommand() *cobra.Command {
	var (
		name, logFile string
		dryRun        bool
	)
	cmd := &cobra.Command{
		Use:   "service install|uninstall|start|stop|status",
		Short: "Run gantry as a service: systemd, launchd or the Windows Service Control Manager",
		Long: `Service installs gantry as a system service and controls it: a systemd unit
on Linux (/etc/systemd/system/<name>.service, logs in the journal unless
--log-file), a launchd daemon on macOS (/Library/LaunchDaemons/dev.gantry.<name>.plist,
log in /Library/Logs/gantry/<name>.log), a service of the Windows Service
Control Manager (log in %ProgramData%\gantry\<name>.log; starts, stops and
failures in the Windows event log). The service starts at boot, restarts
after a failure, and is given 15 s to stop (gantry stops within 10 s).

What it runs follows '--': 'gantry run' (the default) or one component,
with their flags; give absolute paths (the service does not start in this
directory). --dry-run prints what would be installed.`,
		Example: `  gantry service install -- run --config /etc/gantry/gantry.yaml --data /var/lib/gantry
  gantry service install --name gantry-worker -- worker --server nats://hub:4222 --user worker --password ...
  gantry service status`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&name, "name", "gantry", "the service's name")
	install := &cobra.Command{
		Use:   "install [--name N] [--log-file F] [--dry-run] [-- GANTRY ARGS...]",
		Short: "Install the service (and start it at boot)",
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := newServiceSpec(name, logFile, args)
			if err != nil {
				return err
			}
			if dryRun {
				return a.printServiceSpec(a.stdout, spec)
			}
			m, err := newServiceManager()
			if err != nil {
				return err
			}
			if err := m.install(spec); err != nil {
				return fmt.Errorf("install service %s: %w", name, err)
			}
			fmt.Fprintf(a.stdout, "service %s installed: gantry %s\n", name, strings.Join(spec.Args, " "))
			return nil
		},
	}
	install.Flags().StringVar(&logFile, "log-file", "", "append the log to this file (default: the journal on Linux, a file under /Library/Logs or %ProgramData% elsewhere)")
	install.Flags().BoolVar(&dryRun, "dry-run", false, "print the unit, property list or service configuration instead of installing it")
	control := func(use, short string, op func(serviceManager, string) error) *cobra.Command {
		return &cobra.Command{Use: use, Short: short, Args: exactArgs(0, "no arguments"),
			RunE: func(*cobra.Command, []string) error {
				m, err := newServiceManager()
				if err != nil {
					return err
				}
				if err := op(m, name); err != nil {
					return fmt.Errorf("%s service %s: %w", use, name, err)
				}
				return nil
			}}
	}
	var runLog string
	run := &cobra.Command{
		Use:    "run [--name N] [--log-file F] -- GANTRY ARGS...",
		Short:  "Run gantry as the service manager starts it (used by the Windows service)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runService(cmd.Context(), name, runLog, args)
		},
	}
	run.Flags().StringVar(&runLog, "log-file", "", "append the log to this file")
	cmd.AddCommand(install,
		control("uninstall", "Stop and remove the service", func(m serviceManager, n string) error { return m.uninstall(n) }),
		control("start", "Start the service", func(m serviceManager, n string) error { return m.start(n) }),
		control("stop", "Stop the service", func(m serviceManager, n string) error { return m.stop(n) }),
		control("status", "Print the service's status", func(m serviceManager, n string) error {
			st, err := m.status(n)
			if err == nil {
				fmt.Fprintln(a.stdout, strings.TrimSpace(st))
			}
			return err
		}),
		run)
	return cmd
}

// newServiceSpec builds the service to install: gantry args (run by
// default), with this binary's absolute path.
func newServiceSpec(name, logFile string, args []string) (serviceSpec, error) {
	if name == "" || strings.ContainsAny(name, " /\\\t\n\"'") {
		return serviceSpec{}, usageError("--name %q: want letters, digits, '-', '_' or '.'", name)
	}
	if len(args) == 0 {
		args = []string{"run"}
	}
	exe, err := os.Executable()
	if err != nil {
		return serviceSpec{}, fmt.Errorf("find the gantry binary: %w", err)
	}
	if exe, err = filepath.Abs(exe); err != nil {
		return serviceSpec{}, fmt.Errorf("find the gantry binary: %w", err)
	}
	return serviceSpec{Name: name, Exe: exe, Args: args, LogFile: cmp.Or(logFile, defaultServiceLog(name))}, nil
}

// printServiceSpec prints what install would install on this system.
func (a *app) printServiceSpec(w io.Writer, s serviceSpec) error {
	var err error
	switch runtime.GOOS {
	case "linux":
		_, err = io.WriteString(w, systemdUnit(s))
	case "darwin":
		_, err = io.WriteString(w, launchdPlist(s))
	case "windows":
		ws := windowsServiceOf(s)
		_, err = fmt.Fprintf(w, "name: %s\ndisplay name: %s\ndescription: %s\ncommand: %s %s\nstart: automatic\nrecovery: restart after %v (reset after %v)\n",
			ws.Name, ws.DisplayName, ws.Description, ws.Exe, strings.Join(ws.Args, " "), ws.RestartDelays, ws.ResetPeriod)
	default:
		return errNoServiceManager
	}
	return err
}

// runServiceForeground runs gantry args in this process, its log appended
// to logFile when set: the service process of a manager that does not
// need the Windows protocol.
func runServiceForeground(ctx context.Context, logFile string, args []string) error {
	out, closeOut, err := serviceLog(logFile)
	if err != nil {
		return err
	}
	defer closeOut()
	if code := Run(ctx, args, os.Stdin, out, out); code != exitOK {
		return withCode(code, fmt.Errorf("gantry %s exited %d", strings.Join(args, " "), code))
	}
	return nil
}

// serviceLog opens logFile for appending, or returns stderr.
func serviceLog(logFile string) (io.Writer, func(), error) {
	if logFile == "" {
		return os.Stderr, func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(logFile), 0o750); err != nil {
		return nil, nil, fmt.Errorf("log dir: %w", err)
	}
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("log file: %w", err)
	}
	return f, func() { _ = f.Close() }, nil
}
