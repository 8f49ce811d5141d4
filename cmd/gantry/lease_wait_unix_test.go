//go:build !windows

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/lease"
)

// resourceLine reads `gantry resource get ID --json`.
func resourceLine(t *testing.T, url, id string) resourceJSON {
	t.Helper()
	code, out, errs := leaseCLI(t, url, "resource", "get", id, "--json")
	if code != exitOK {
		t.Fatalf("resource get %s = exit %d (%s)", id, code, errs)
	}
	var r resourceJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("resource get %s --json: %v in %q", id, err, out)
	}
	return r
}

// waitWaiting polls `gantry resource get` until n wait in line for id.
func waitWaiting(t *testing.T, url, id string, n int) resourceJSON {
	t.Helper()
	var r resourceJSON
	poll.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if r = resourceLine(t, url, id); r.Waiting != n || len(r.Waiters) != n {
			return fmt.Errorf("%s: waiting = %d (%d waiters), want %d", id, r.Waiting, len(r.Waiters), n)
		}
		return nil
	})
	return r
}

// startCLI starts gantry with args as a child process; its stdout and
// stderr are read once it has exited.
func startCLI(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	c := gantryCmd(t, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.ProcessState == nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	return c, &out, &errb
}

func TestLeaseAcquireWait(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	u := env.URL
	if code, _, errs := leaseCLI(t, u, "resource", "add", "cam1"); code != exitOK {
		t.Fatalf("add = %d %q", code, errs)
	}
	if code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "alice", "--ttl", "5m"); code != exitOK {
		t.Fatalf("acquire by alice = %d %q", code, errs)
	}
	// A wait that runs out exits 3, saying who held it.
	for _, flag := range []string{"--wait=500ms", "--wait-timeout=500ms"} {
		start := time.Now()
		code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "bob", flag)
		if code != exitConflict || !strings.Contains(errs, "gantry: waiting for cam1: held by alice until") ||
			!strings.Contains(errs, "1st of 1 in line") || !strings.Contains(errs, "gave up waiting for cam1 after") {
			t.Errorf("acquire %s while alice holds = exit %d, stderr %q; want 3, the wait and the holder", flag, code, errs)
		}
		if d := time.Since(start); d < 500*time.Millisecond {
			t.Errorf("acquire %s gave up after %v, want at least 500ms", flag, d)
		}
	}
	if r := resourceLine(t, u, "cam1"); r.Waiting != 0 {
		t.Errorf("waiting after the waits gave up = %d, want 0", r.Waiting)
	}
	// A wait without a limit gets the resource when alice releases it.
	c, out, errb := startCLI(t, "--server", u, "lease", "acquire", "cam1", "--owner", "bob", "--wait", "--json")
	r := waitWaiting(t, u, "cam1", 1)
	if r.Waiters[0].Owner != "bob" || r.LeaseOwner != "alice" || r.LeaseUntil == nil {
		t.Errorf("resource while bob waits = %+v, want alice holding, bob in line", r)
	}
	code, table, _ := leaseCLI(t, u, "resource", "ls")
	if lines := strings.Split(strings.TrimSpace(table), "\n"); code != exitOK || len(lines) != 2 ||
		!strings.Contains(lines[0], "WAITING") || strings.Fields(lines[1])[4] != "1" {
		t.Errorf("resource ls = %d %q, want a WAITING column saying 1", code, table)
	}
	released := time.Now()
	if code, _, errs := leaseCLI(t, u, "lease", "release", "cam1", "--owner", "alice"); code != exitOK {
		t.Fatalf("release by alice = %d %q", code, errs)
	}
	if code := exitOf(t, c); code != exitOK {
		t.Fatalf("acquire --wait = exit %d (%s), want 0", code, errb)
	}
	// Under -race a child process sleeps 1 s before it exits
	// (GORACE atexit_sleep_ms).
	t.Logf("release -> acquire --wait exited: %v", time.Since(released))
	if !strings.Contains(out.String(), `"owner": "bob"`) || !strings.Contains(errb.String(), "held by alice") {
		t.Errorf("acquire --wait = stdout %q, stderr %q; want bob's lease, and the wait said", out, errb)
	}
	if r := resourceLine(t, u, "cam1"); r.State != "LEASED" || r.LeaseOwner != "bob" || r.Waiting != 0 {
		t.Errorf("resource after = %+v, want LEASED by bob, nobody waiting", r)
	}
	for _, flag := range []string{"--wait=soon", "--wait=-1s"} {
		if code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "carol", flag); code != exitUsage {
			t.Errorf("acquire %s = exit %d %q, want 2", flag, code, errs)
		}
	}
}

func TestLeaseRunWait(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	u := env.URL
	dir := t.TempDir()
	if code, _, errs := leaseCLI(t, u, "resource", "add", "cam1"); code != exitOK {
		t.Fatalf("add = %d %q", code, errs)
	}
	if code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "alice", "--ttl", "5m"); code != exitOK {
		t.Fatalf("acquire by alice = %d %q", code, errs)
	}
	// Running out exits 3 without starting the command.
	ran := filepath.Join(dir, "ran")
	c, out, errb := startCLI(t, "--server", u, "lease", "run", "cam1", "--wait=500ms", "--", "touch", ran)
	if code := exitOf(t, c); code != exitConflict || !strings.Contains(errb.String(), "gave up waiting for cam1") {
		t.Errorf("lease run --wait=500ms on a held resource = exit %d (%s%s), want 3", code, out, errb)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran although the wait ran out")
	}
	// Three runners wait; none overlaps another: each takes a directory
	// only one can hold (mkdir is atomic) for 0.3s.
	lock, log := filepath.Join(dir, "lock"), filepath.Join(dir, "log")
	script := `mkdir "$1" || echo overlap >> "$2"; sleep 0.3; rmdir "$1"; echo "$GANTRY_LEASE_OWNER" >> "$2"`
	var runners []*exec.Cmd
	for i := range 3 {
		c, _, _ := startCLI(t, "--server", u, "lease", "run", "cam1", "--owner", fmt.Sprintf("r%d", i), "--wait", "--", "sh", "-c", script, "sh", lock, log)
		runners = append(runners, c)
	}
	waitWaiting(t, u, "cam1", 3)
	if code, _, errs := leaseCLI(t, u, "lease", "release", "cam1", "--owner", "alice"); code != exitOK {
		t.Fatalf("release by alice = %d %q", code, errs)
	}
	for i, c := range runners {
		if code := exitOf(t, c); code != exitOK {
			t.Errorf("runner %d = exit %d, want 0", i, code)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Fields(string(data)); len(lines) != 3 || strings.Contains(string(data), "overlap") {
		t.Errorf("runs = %q, want three, none overlapping", lines)
	}
}

func TestLeaseWaitKilledWaiterLapses(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	u := env.URL
	if code, _, errs := leaseCLI(t, u, "resource", "add", "cam1"); code != exitOK {
		t.Fatalf("add = %d %q", code, errs)
	}
	if code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "alice", "--ttl", "5m"); code != exitOK {
		t.Fatalf("acquire by alice = %d %q", code, errs)
	}
	first, _, _ := startCLI(t, "--server", u, "lease", "run", "cam1", "--owner", "first", "--wait", "--", "true")
	waitWaiting(t, u, "cam1", 1)
	ran := filepath.Join(t.TempDir(), "ran")
	second, _, errb := startCLI(t, "--server", u, "lease", "run", "cam1", "--owner", "second", "--wait", "--", "touch", ran)
	r := waitWaiting(t, u, "cam1", 2)
	if r.Waiters[0].Owner != "first" || r.Waiters[1].Owner != "second" {
		t.Fatalf("line = %+v, want first then second", r.Waiters)
	}
	// The first dies without a word: its place lapses after its ticket's
	// TTL, and the second goes next.
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	released := time.Now()
	if code, _, errs := leaseCLI(t, u, "lease", "release", "cam1", "--owner", "alice"); code != exitOK {
		t.Fatalf("release by alice = %d %q", code, errs)
	}
	if code := exitOf(t, second); code != exitOK {
		t.Fatalf("second = exit %d (%s), want 0", code, errb)
	}
	waited := time.Since(released)
	t.Logf("release -> second done, behind a killed first: %v", waited)
	if waited > lease.DefaultTicketTTL+10*time.Second {
		t.Errorf("second waited %v behind a dead waiter, want about its ticket's TTL (%v)", waited, lease.DefaultTicketTTL)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Errorf("second's command did not run: %v", err)
	}
}

// TestRunTasksQueueOnResource: through `gantry run`, ten 0.2 s exec tasks
// on one resource run one after another as each ends, and a task waiting
// behind a lease taken by hand starts when `lease release` gives it up.
func TestRunTasksQueueOnResource(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, ready := startGantry(t, "run", "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	u := ready.NATS
	if code, _, errs := leaseCLI(t, u, "resource", "add", "cam1"); code != exitOK {
		t.Fatalf("add = %d %q", code, errs)
	}
	// A manual lease holds a task back until its release.
	if code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "alice", "--ttl", "5m"); code != exitOK {
		t.Fatalf("acquire by alice = %d %q", code, errs)
	}
	code, out, errs := leaseCLI(t, u, "submit", "exec", "--id", "behind", "--resource", "cam1", "--payload", `{"cmd":["true"]}`)
	if code != exitOK {
		t.Fatalf("submit = %d %q", code, errs)
	}
	r := waitWaiting(t, u, "cam1", 1)
	if r.Waiters[0].TaskID != "behind" {
		t.Errorf("line = %+v, want task behind", r.Waiters)
	}
	// The record follows the wait's status as it is written (the first
	// may say the resource was free an instant before alice's lease was
	// read).
	poll.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if rec := taskJSON(t, u, "behind"); rec.State != "WAITING" || !strings.Contains(rec.LastError, "waiting for resource cam1: held by alice") {
			return fmt.Errorf("task while waiting = %s %q, want WAITING for cam1 held by alice", rec.State, rec.LastError)
		}
		return nil
	})
	released := time.Now()
	if code, _, errs := leaseCLI(t, u, "lease", "release", "cam1", "--owner", "alice"); code != exitOK {
		t.Fatalf("release by alice = %d %q", code, errs)
	}
	var rec wire.TaskRecord
	poll.For(t, 30*time.Second, 20*time.Millisecond, func() error {
		if rec = taskJSON(t, u, "behind"); rec.State != wire.TaskSucceeded {
			return fmt.Errorf("task behind = %s (%s), want SUCCEEDED", rec.State, rec.LastError)
		}
		return nil
	})
	woke := time.Since(released)
	t.Logf("lease release -> waiting task succeeded: %v (%s)", woke, out)
	// The old behaviour retried after min(holder's TTL, 30 s delay).
	if woke > 15*time.Second || rec.Attempts != 1 {
		t.Errorf("task behind = %v after the release, %d attempts; want far less than the 30s delay, 1 attempt", woke, rec.Attempts)
	}

	// Ten 0.2 s tasks: a mkdir only one can hold says none overlaps
	// (exit 9 is a permanent failure).
	lock := filepath.Join(dir, "lock")
	payload := fmt.Sprintf(`{"cmd":["sh","-c","mkdir %s || exit 9; sleep 0.2; rmdir %s"],"fail_exit_codes":[9]}`, lock, lock)
	start := time.Now()
	for i := range 10 {
		if code, _, errs := leaseCLI(t, u, "submit", "exec", "--id", fmt.Sprintf("ten-%d", i), "--resource", "cam1", "--payload", payload); code != exitOK {
			t.Fatalf("submit = %d %q", code, errs)
		}
	}
	for i := range 10 {
		id := fmt.Sprintf("ten-%d", i)
		poll.For(t, 30*time.Second-time.Since(start), 20*time.Millisecond, func() error {
			if rec = taskJSON(t, u, id); rec.State != wire.TaskSucceeded {
				return fmt.Errorf("task %s = %s (%s), want SUCCEEDED", id, rec.State, rec.LastError)
			}
			return nil
		})
		if rec.Attempts != 1 {
			t.Errorf("task %s attempts = %d, want 1", id, rec.Attempts)
		}
	}
	t.Logf("ten 0.2s exec tasks on one resource through gantry run: %v", time.Since(start))
}
