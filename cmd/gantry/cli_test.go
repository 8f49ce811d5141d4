package main

import (
	"net"
	"os"
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
