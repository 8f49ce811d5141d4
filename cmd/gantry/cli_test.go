package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-dev/gantry/internal/brokertest"
)

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"unknown flag", []string{"run", "--no-such-flag"}, "unknown flag"},
		{"extra argument", []string{"run", "extra"}, "want no arguments"},
		{"bad log level", []string{"run", "--log-level", "loud", "--data", t.TempDir()}, "log level"},
		{"bad sync", []string{"run", "--sync", "sometimes", "--data", t.TempDir(), "--log-format", "json"}, "--sync"},
		{"missing config", []string{"run", "--config", "/nonexistent/gantry.yaml"}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runInProcess(t, tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("gantry %v = exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, stderr, exitUsage, tc.want)
			}
		})
	}
}

func TestBadConfigKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "gantry.yaml")
	if err := os.WriteFile(path, []byte("jobs:\n  - {name: a, type: noop, evry: 1m}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runInProcess(t, "run", "--config", path, "--data", t.TempDir())
	if code != exitUsage || !strings.Contains(stderr, `unknown key "evry"`) {
		t.Errorf("run with a bad key = exit %d, stderr %q; want exit 2 naming the key", code, stderr)
	}
}

func TestInsecureListenRefused(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "broker"} {
		code, _, stderr := runInProcess(t, cmd, "--nats-listen", "0.0.0.0:0", "--data", t.TempDir(), "--log-format", "json")
		if code != exitUsage || !strings.Contains(stderr, "auth.users") {
			t.Errorf("%s --nats-listen 0.0.0.0:0 = exit %d, stderr %q; want exit 2 saying to configure auth.users", cmd, code, stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runInProcess(t, "version", "--json")
	if code != exitOK || !strings.Contains(stdout, `"nats-server"`) {
		t.Errorf("version --json = exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestRunComponentFailure starts 'gantry run' in this process with an audit
// store that cannot open: it exits 1 naming the store, and goleak in TestMain
// checks that nothing it started keeps running.
func TestRunComponentFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "audit"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runInProcess(t, "run", "--data", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--log-format", "json")
	if code != exitFailure || !strings.Contains(stderr, "audit store") {
		t.Errorf("run with an unopenable audit store = exit %d, stderr %q; want exit 1 naming the audit store", code, stderr)
	}
}

// TestProcessAbort checks that a process that will not run releases its
// HTTP listener and closes its connections.
func TestProcessAbort(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	p := newProcess(brokertest.Logger(t))
	nc, _, err := p.connect(env.Broker, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.addHTTP("127.0.0.1:0", nc); err != nil {
		t.Fatal(err)
	}
	addr := p.http.Addr()
	p.abort()
	if !nc.IsClosed() {
		t.Error("connection open after abort, want closed")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("HTTP port %s still taken after abort: %v", addr, err)
	}
	ln.Close()
}

// runBinary runs gantry as a child process and returns its exit code and
// output.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runBinaryEnv(t, nil, args...)
}

// runBinaryEnv is runBinary with env added to the child's environment.
func runBinaryEnv(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := gantryCmd(t, args...)
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("gantry %v: %v", args, err)
	}
	return code, out.String(), errb.String()
}

// TestCLIConventions runs the binary the way kubectl and the nats CLI are
// used: unknown subcommands and bare groups are usage errors (exit 2),
// errors are JSON under --json, --version and completion work.
func TestCLIConventions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args        []string
		code        int
		out, errOut string
	}{
		{[]string{"task", "rm", "x"}, exitUsage, "", `unknown command "rm" for "gantry task"`},
		{[]string{"lease", "frob"}, exitUsage, "", `unknown command "frob"`},
		{[]string{"audit"}, exitUsage, "", `"gantry audit" needs a subcommand: backup, query, tail`},
		{[]string{"job", "paus", "x"}, exitUsage, "", "did you mean pause?"},
		{[]string{"--version"}, exitOK, "gantry ", ""},
		{[]string{"version", "--json"}, exitOK, `"commit"`, ""},
		{[]string{"completion", "bash"}, exitOK, "bash completion", ""},
		{[]string{"lease", "frob", "--json"}, exitUsage, "", `{"error":"unknown command \"frob\" for \"gantry lease\": want one of acquire, ls, release, renew, run","code":2}`},
		{[]string{"task", "get", "x", "--json", "--server", "nats://127.0.0.1:1", "--timeout", "1s"}, exitFailure, "", `"code":1}`},
		{[]string{"task", "ls", "--no-such-flag", "--json"}, exitUsage, "", `{"error":"unknown flag: --no-such-flag","code":2}`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runBinary(t, tc.args...)
			if code != tc.code || !strings.Contains(stdout, tc.out) || !strings.Contains(stderr, tc.errOut) {
				t.Errorf("gantry %v = exit %d, stdout %.200q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					tc.args, code, stdout, stderr, tc.code, tc.out, tc.errOut)
			}
		})
	}
}
