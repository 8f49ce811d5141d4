package main

import (
	"bytes"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPortInUse: 'gantry run' and 'gantry broker' on a NATS or HTTP port
// another process holds fail within a second, exit 2, and say which port
// and what to do; nothing that looks like the ready line is logged.
func TestPortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Closed when the parallel subtests are done, not when this returns.
	t.Cleanup(func() { ln.Close() })
	taken := ln.Addr().String()
	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"run nats", []string{"run", "--nats-listen", taken, "--http-listen", ""}, "--nats-listen"},
		{"broker nats", []string{"broker", "--nats-listen", taken, "--http-listen", ""}, "--nats-listen"},
		{"run http", []string{"run", "--nats-listen", "127.0.0.1:0", "--http-listen", taken}, "--http-listen"},
		{"broker http", []string{"broker", "--nats-listen", "127.0.0.1:0", "--http-listen", taken}, "--http-listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := gantryCmd(t, append(tc.args, "--data", t.TempDir(), "--log-format", "text")...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			start := time.Now()
			err := cmd.Run()
			took := time.Since(start)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
				t.Fatalf("gantry %v = %v, want exit %d; stderr:\n%s", tc.args, err, exitUsage, stderr.String())
			}
			if took > time.Second {
				t.Errorf("gantry %v took %v to fail, want under 1s", tc.args, took)
			}
			out := stderr.String()
			for _, want := range []string{tc.flag, taken, "HOST:PORT"} {
				if !strings.Contains(out, want) {
					t.Errorf("stderr = %q, want it to name %q", out, want)
				}
			}
			for _, ready := range []string{readyMsg, "Server is ready"} {
				if strings.Contains(out, ready) {
					t.Errorf("stderr = %q, want no %q line", out, ready)
				}
			}
		})
	}
}
