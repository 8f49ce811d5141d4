//go:build !windows

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
)

// startLeaseRun starts `gantry lease run` as a child process.
func startLeaseRun(t *testing.T, url string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	c := gantryCmd(t, append([]string{"--server", url, "lease", "run"}, args...)...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.ProcessState == nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	return c, &out
}

// readPID reads the process id a command wrote into path.
func readPID(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("pid file %s = %q: %v", path, data, err)
	}
	return pid
}

func TestLeaseRunHoldsPastTTL(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := t.TempDir()
	started, stop := filepath.Join(dir, "started"), filepath.Join(dir, "stop")
	c, out := startLeaseRun(t, env.URL, "cam1", "--owner", "runner", "--ttl", "1s", "--",
		"sh", "-c", `[ "$GANTRY_RESOURCE" = cam1 ] && touch "$1"; while [ ! -f "$2" ]; do sleep 0.05; done`, "sh", started, stop)
	proctreetest.WaitFile(t, started)
	// Three TTLs: the lease stays the runner's all along.
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		code, _, errs := leaseCLI(t, env.URL, "lease", "acquire", "cam1", "--owner", "other", "--ttl", "1s")
		if code != exitConflict || !strings.Contains(errs, "held by runner") {
			t.Fatalf("acquire while lease run holds = %d %q, want 3 naming runner", code, errs)
		}
		time.Sleep(100 * time.Millisecond) // the span of three TTLs is what is observed, not a wait
	}
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, c); code != 0 {
		t.Fatalf("lease run = exit %d (%s), want 0", code, out)
	}
	if code, out, _ := leaseCLI(t, env.URL, "lease", "ls", "--json"); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("lease ls after lease run = %d %q, want []", code, out)
	}
}

func TestLeaseRunExitCode(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	if code, _, errs := leaseCLI(t, env.URL, "resource", "add", "cam1"); code != exitOK {
		t.Fatalf("add = %d %q", code, errs)
	}
	c, out := startLeaseRun(t, env.URL, "cam1", "--", "sh", "-c", "exit 7")
	if code := exitOf(t, c); code != 7 {
		t.Errorf("lease run of 'exit 7' = exit %d (%s), want 7", code, out)
	}
	// A failing command is a task failure: the resource is AVAILABLE.
	if code, out, _ := leaseCLI(t, env.URL, "resource", "get", "cam1", "--json"); code != exitOK || !strings.Contains(out, `"state": "AVAILABLE"`) {
		t.Errorf("resource after a failed command = %d %q, want AVAILABLE", code, out)
	}
}

func TestLeaseRunConflictDoesNotStart(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	if code, _, errs := leaseCLI(t, env.URL, "lease", "acquire", "cam1", "--owner", "alice", "--ttl", "1m"); code != exitOK {
		t.Fatalf("acquire = %d %q", code, errs)
	}
	ran := filepath.Join(t.TempDir(), "ran")
	c, out := startLeaseRun(t, env.URL, "cam1", "--owner", "bob", "--", "touch", ran)
	if code := exitOf(t, c); code != exitConflict || !strings.Contains(out.String(), "held by alice") {
		t.Errorf("lease run on a held resource = exit %d (%s), want 3 naming alice", code, out)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran although the resource was held")
	}
}

func TestLeaseRunLostKillsTree(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := t.TempDir()
	pidFile, started := filepath.Join(dir, "pid"), filepath.Join(dir, "started")
	c, out := startLeaseRun(t, env.URL, "cam1", "--ttl", "1s", "--",
		"sh", "-c", `sleep 300 & echo $! > "$1"; touch "$2"; wait`, "sh", pidFile, started)
	proctreetest.WaitFile(t, started)
	grandchild := readPID(t, pidFile)
	// Someone purges the lease: the next renewal finds it lost.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bucket, err := env.JS.KeyValue(ctx, wire.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	if err := bucket.Purge(ctx, "cam1"); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, c); code != exitLeaseLost || !strings.Contains(out.String(), "lost") {
		t.Errorf("lease run after losing its lease = exit %d (%s), want %d saying lost", code, out, exitLeaseLost)
	}
	proctreetest.WaitDead(t, "the command's child survived the lost lease", grandchild)
}

// TestLeaseRunLostWhileStopped: gantry itself is stopped (SIGSTOP) past
// its TTL; another owner takes the resource. Whether the command ended in
// the meantime or still runs when gantry resumes, lease run exits
// exitLeaseLost, never 0, and a command still running is killed. The
// command's GANTRY_LEASE_REVISION is below the new holder's: a fencing
// token the systems it writes to can check.
func TestLeaseRunLostWhileStopped(t *testing.T) {
	t.Parallel()
	for _, endsWhileStopped := range []bool{true, false} {
		t.Run(fmt.Sprintf("command ends while stopped %v", endsWhileStopped), func(t *testing.T) {
			t.Parallel()
			env := brokertest.Start(t)
			dir := t.TempDir()
			rev, pid, stop := filepath.Join(dir, "rev"), filepath.Join(dir, "pid"), filepath.Join(dir, "stop")
			c, out := startLeaseRun(t, env.URL, "cam1", "--owner", "runner", "--ttl", "1s", "--", "sh", "-c",
				`echo $$ > "$2"; echo "$GANTRY_LEASE_REVISION" > "$1.tmp" && mv "$1.tmp" "$1"; while [ ! -f "$3" ]; do sleep 0.05; done`,
				"sh", rev, pid, stop)
			proctreetest.WaitFile(t, rev)
			token := readPID(t, rev)
			if err := syscall.Kill(c.Process.Pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					_ = syscall.Kill(c.Process.Pid, syscall.SIGCONT)
				}
			}
			t.Cleanup(resume)
			var taken wire.Lease
			poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
				code, stdout, stderr := leaseCLI(t, env.URL, "lease", "acquire", "cam1", "--owner", "other", "--ttl", "30s", "--json")
				if code != exitOK {
					return fmt.Errorf("acquire by other = exit %d (%s)", code, stderr)
				}
				return json.Unmarshal([]byte(stdout), &taken)
			})
			if taken.Revision <= uint64(token) {
				t.Errorf("GANTRY_LEASE_REVISION = %d, new holder's revision %d; want it lower", token, taken.Revision)
			}
			cmdPID := readPID(t, pid)
			if endsWhileStopped {
				if err := os.WriteFile(stop, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				proctreetest.WaitDead(t, "the command did not end", cmdPID)
			}
			resume()
			if code := exitOf(t, c); code != exitLeaseLost || !strings.Contains(out.String(), "lost") {
				t.Errorf("lease run that lost its lease while stopped = exit %d (%s), want %d saying lost", code, out, exitLeaseLost)
			}
			proctreetest.WaitDead(t, "the command outlived the lost lease", cmdPID)
		})
	}
}

func TestLeaseRunKillsLeftovers(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	c, out := startLeaseRun(t, env.URL, "cam1", "--",
		"sh", "-c", `sleep 300 >/dev/null 2>&1 & echo $! > "$1"`, "sh", pidFile)
	if code := exitOf(t, c); code != 0 {
		t.Fatalf("lease run = exit %d (%s), want 0", code, out)
	}
	proctreetest.WaitDead(t, "a process the command left behind outlived the lease", readPID(t, pidFile))
}

func TestLeaseRunForwardsSIGTERM(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	started := filepath.Join(t.TempDir(), "started")
	c, out := startLeaseRun(t, env.URL, "cam1", "--",
		"sh", "-c", `trap 'exit 42' TERM; touch "$1"; while :; do sleep 0.05; done`, "sh", started)
	proctreetest.WaitFile(t, started)
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, c); code != 42 {
		t.Errorf("lease run after SIGTERM = exit %d (%s), want the command's 42", code, out)
	}
	if code, out, _ := leaseCLI(t, env.URL, "lease", "ls", "--json"); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("lease ls after SIGTERM = %d %q, want [] (released)", code, out)
	}
}

func TestRunReclaimsAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gantry.yaml")
	if err := os.WriteFile(cfg, []byte("resources:\n  - {id: cam1, reclaim: fault}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	args := []string{"run", "--data", data, "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg}
	g, ready := startGantry(t, args...)
	pidFile, started := filepath.Join(dir, "pid"), filepath.Join(dir, "started")
	c, _ := startLeaseRun(t, ready.NATS, "cam1", "--ttl", "1s", "--", "sh", "-c", `echo $$ > "$1"; touch "$2"; sleep 300`, "sh", pidFile, started)
	proctreetest.WaitFile(t, started)
	if code, out, _ := leaseCLI(t, ready.NATS, "resource", "get", "cam1", "--json"); !strings.Contains(out, `"state": "RUNNING"`) {
		t.Fatalf("resource under lease run = %d %q, want RUNNING", code, out)
	}
	// gantry stops while the command runs: lease run's renewals fail, so it
	// kills its command and exits exitLeaseLost; the resource is left
	// RUNNING.
	if err := g.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, g); code != 0 {
		t.Fatalf("gantry run after SIGTERM = exit %d", code)
	}
	if code := exitOf(t, c); code != exitLeaseLost {
		t.Errorf("lease run after the broker went away = exit %d, want %d", code, exitLeaseLost)
	}
	// gantry restarts: its keeper finds cam1 RUNNING without a lease.
	_, ready = startGantry(t, args...)
	poll.For(t, 15*time.Second, 100*time.Millisecond, func() error {
		_, out, _ := leaseCLI(t, ready.NATS, "resource", "get", "cam1", "--json")
		if !strings.Contains(out, `"state": "FAULT"`) || !strings.Contains(out, "lost while RUNNING") {
			return fmt.Errorf("resource after restart = %q, want FAULT (reclaim policy fault) with the reason", out)
		}
		return nil
	})
}

// resourceMoves returns the moves (the messages of the
// RESOURCE_STATE_CHANGED events) of resource stored so far.
func resourceMoves(t *testing.T, js jetstream.JetStream, resource string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventResourceStateChanged.Subject()}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(1000)
	if err != nil {
		t.Fatal(err)
	}
	var moves []string
	for msg := range batch.Messages() {
		var ev wire.Event
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.ResourceID == resource {
			moves = append(moves, ev.Message)
		}
	}
	return moves
}

// TestLeaseRunCannotStart: a command that is missing or not executable
// exits 127 or 126 like a shell, and its resource goes LEASED -> AVAILABLE,
// never RUNNING.
func TestLeaseRunCannotStart(t *testing.T) {
	t.Parallel()
	plain := filepath.Join(t.TempDir(), "plain.sh")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cmd  string
		code int
		msg  string
	}{
		{"missing", "./missing.sh", 127, "./missing.sh: not found"},
		{"not executable", plain, 126, "plain.sh: not executable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := brokertest.Start(t)
			if code, _, errs := leaseCLI(t, env.URL, "resource", "add", "cam1"); code != exitOK {
				t.Fatalf("add = %d %q", code, errs)
			}
			code, _, errs := leaseCLI(t, env.URL, "lease", "run", "cam1", "--", tc.cmd)
			if code != tc.code || !strings.Contains(errs, tc.msg) {
				t.Errorf("lease run -- %s = exit %d (%q), want %d saying %q", tc.cmd, code, errs, tc.code, tc.msg)
			}
			moves := resourceMoves(t, env.JS, "cam1")
			for _, m := range moves {
				if strings.Contains(m, "-> RUNNING") {
					t.Errorf("moves = %q, want none to RUNNING for a command that never started", moves)
				}
			}
			if len(moves) == 0 || !strings.Contains(moves[len(moves)-1], "LEASED -> AVAILABLE") {
				t.Errorf("moves = %q, want the last LEASED -> AVAILABLE (the lease released)", moves)
			}
		})
	}
}
