//go:build !windows

package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

func TestRunReadyAndSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, ready := startGantry(t, "run", "--data", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--config", "../../examples/gantry.yaml")

	nc, js := brokertest.Connect(t, ready.NATS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var buckets []string
	for name := range js.KeyValueStoreNames(ctx).Name() {
		buckets = append(buckets, name)
	}
	for _, want := range wire.Buckets {
		if !slices.Contains(buckets, want) {
			t.Errorf("buckets = %v, want %s", buckets, want)
		}
	}
	// On loopback the Go runtime's profiles are served too (docs/operations.md).
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/debug/pprof/heap?debug=1": "heap profile", "/debug/pprof/goroutine?debug=1": "goroutine profile"} {
		resp, err := http.Get(ready.HTTP + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s = %d %.200q, want 200 with %q", path, resp.StatusCode, body, want)
		}
	}
	nc.Close()

	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM = %v, want 0", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("stopped %v after SIGTERM, want within 10s", d)
		}
	case <-time.After(12 * time.Second):
		t.Fatal("still running 12s after SIGTERM")
	}
}

func TestBrokerCommandRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, ready := startGantry(t, "broker", "--data", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	nc, js := brokertest.Connect(t, ready.NATS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, wire.BucketResources)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "cam1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGINT = %v, want 0", err)
	}

	_, ready = startGantry(t, "broker", "--data", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	_, js = brokertest.Connect(t, ready.NATS)
	kv, err = js.KeyValue(ctx, wire.BucketResources)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "cam1")
	if err != nil || !strings.EqualFold(string(e.Value()), "kept") {
		t.Errorf("cam1 after restart = %v, %v; want kept", e, err)
	}
}

// TestRunWithAuth: with auth.users every component still connects (in
// process, as the internal user), and a client needs the credentials.
func TestRunWithAuth(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "gantry.yaml")
	if err := os.WriteFile(cfg, []byte("auth:\n  users:\n    - {user: ops, password: s3cret-pass}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ready := startGantry(t, "run", "--config", cfg, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	code, _, stderr := runInProcess(t, "task", "ls", "--server", ready.NATS)
	if code != exitFailure || !strings.Contains(stderr, "--user and --password") {
		t.Errorf("task ls without credentials = exit %d, %q; want exit 1 asking for --user and --password", code, stderr)
	}
	code, _, stderr = runInProcess(t, "submit", "noop", "--wait", "--server", ready.NATS, "--user", "ops", "--password", "s3cret-pass")
	if code != exitOK {
		t.Errorf("submit --wait with credentials = exit %d (%s), want 0: the workers must run under auth", code, stderr)
	}
}
