package proctree

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
)

// escapeScript starts two processes that leave the tree's process group:
// a setsid child, and a setsid grandchild whose parent exits at once (a
// double fork). Each writes its pid to $PIDS; once both have, the script
// runs $THEN.
const escapeScript = `setsid sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &
(setsid sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &)
while [ "$(cat "$PIDS" 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.01; done
eval "$THEN"`

// TestEscapeesDie: what leaves the process group (setsid, a double fork)
// is killed with the tree however it ends, under a cgroup and under a
// subreaper.
func TestEscapeesDie(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid:", err)
	}
	for _, c := range []Containment{Cgroup, Subreaper} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			s := starter(t, c)
			for _, tc := range []struct {
				name string
				then string
				end  func(t *testing.T, tree *Tree, cancel context.CancelFunc)
			}{
				{"command exits", "exit 0", func(*testing.T, *Tree, context.CancelFunc) {}},
				{"kill", "wait", func(t *testing.T, tree *Tree, _ context.CancelFunc) {
					if err := tree.Kill(); err != nil {
						t.Errorf("Kill = %v, want nil", err)
					}
				}},
				{"cancel", "wait", func(_ *testing.T, _ *Tree, cancel context.CancelFunc) { cancel() }},
				{"cancel, SIGTERM ignored", "trap '' TERM; wait", func(_ *testing.T, _ *Tree, cancel context.CancelFunc) { cancel() }},
			} {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					pidFile := filepath.Join(t.TempDir(), "pids")
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					script := escapeScript
					if strings.Contains(tc.then, "trap") {
						// Ignored before the escapees start, so they inherit it.
						script = "trap '' TERM; " + script
					}
					cmd := shell(ctx, script, "PIDS="+pidFile, "THEN="+tc.then)
					// The escapees hold stdout: Wait must not wait out the grace
					// for it, as it would if they outlived the tree.
					var out bytes.Buffer
					cmd.Stdout = &out
					const grace = time.Minute
					if strings.Contains(tc.then, "trap") {
						cmd.WaitDelay = 300 * time.Millisecond
					} else {
						cmd.WaitDelay = grace
					}
					tree := start(t, s, cmd)
					pids := proctreetest.ReadPids(t, pidFile, 2)
					began := time.Now()
					tc.end(t, tree, cancel)
					err := wait(t, tree)
					if tc.then == "exit 0" && err != nil {
						t.Errorf("Wait = %v, want nil", err)
					}
					if took := time.Since(began); took >= grace {
						t.Errorf("Wait took %v, want the escapees killed and their output closed before the %v grace", took, grace)
					}
					proctreetest.WaitDead(t, "the whole tree is killed", pids...)
				})
			}
		})
	}
}

// TestSignalReachesEscapees: under a cgroup or a subreaper, Signal reaches
// the processes that left the process group too.
func TestSignalReachesEscapees(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid:", err)
	}
	for _, c := range []Containment{Cgroup, Subreaper} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			s := starter(t, c)
			dir := t.TempDir()
			pidFile, mark := filepath.Join(dir, "pids"), filepath.Join(dir, "mark")
			// The root traps USR1 rather than ignoring it: an ignored signal
			// could not be trapped by the escapee.
			cmd := shell(context.Background(), `trap : USR1
setsid sh -c 'trap "touch \"$MARK\"; exit 0" USR1; echo $$ >> "$PIDS"; while :; do sleep 0.05; done' &
while [ ! -f "$MARK" ]; do sleep 0.05; done`, "PIDS="+pidFile, "MARK="+mark)
			tree := start(t, s, cmd)
			pids := proctreetest.ReadPids(t, pidFile, 1)
			if err := tree.Signal(syscall.SIGUSR1); err != nil {
				t.Fatalf("Signal = %v, want nil", err)
			}
			proctreetest.WaitFile(t, mark)
			_ = wait(t, tree)
			proctreetest.WaitDead(t, "the whole tree is killed", pids...)
		})
	}
}

// TestParentDeath: a gantry killed with SIGKILL takes its tree along: the
// command at once (a parent-death signal; with a subreaper, the shim kills
// the escapees too), and under a cgroup the escapees when a Starter is
// next made in the same cgroup.
func TestParentDeath(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid:", err)
	}
	for _, c := range containments() {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			starter(t, c) // skips where the containment is not allowed
			dir := t.TempDir()
			pidFile := filepath.Join(dir, "pids")
			stderr, err := os.Create(filepath.Join(dir, "stderr"))
			if err != nil {
				t.Fatal(err)
			}
			defer stderr.Close()
			script, n := escapeScript, 3
			if c == Group {
				// Escapees outlive a Group tree: only the command is watched.
				script, n = "", 1
			}
			script += "\n" + `echo $$ >> "$PIDS"; exec sleep 300`
			parent := exec.Command(os.Args[0], "-test.run=^$")
			parent.Env = append(os.Environ(), helperEnv+"=parent", "CONTAINMENT="+string(c),
				"SCRIPT="+script, "PIDS="+pidFile, "THEN=true")
			parent.Stderr = stderr
			if err := parent.Start(); err != nil {
				t.Fatal(err)
			}
			var pids []int
			check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
				data, _ := os.ReadFile(pidFile)
				if pids = parsePids(data); len(pids) < n {
					msg, _ := os.ReadFile(stderr.Name())
					return fmt.Errorf("the tree wrote %d pids, want %d (helper stderr %q)", len(pids), n, msg)
				}
				return nil
			})
			if err := parent.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = parent.Wait()
			if c == Cgroup {
				proctreetest.WaitDead(t, "the whole tree is killed", pids[n-1])
				// The escapees are left in the dead parent's cgroup until a
				// Starter is made in the same cgroup.
				starter(t, Cgroup)
			}
			proctreetest.WaitDead(t, "the whole tree is killed", pids...)
		})
	}
}

func parsePids(data []byte) []int {
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestWaitCutsOffEscapedOutput: a process that left a Group tree (setsid)
// and holds stdout keeps Wait no longer than WaitDelay.
func TestWaitCutsOffEscapedOutput(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid:", err)
	}
	s := starter(t, Group)
	cmd := shell(context.Background(), `setsid sleep 300 & echo $!`)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.WaitDelay = 200 * time.Millisecond
	if err := wait(t, start(t, s, cmd)); err != nil {
		t.Errorf("Wait = %v, want nil: the command's own exit is what counts", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("output = %q, want the escaped pid", out.String())
	}
	// The escaped process is out of the tree's reach: the test kills it.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill the escaped process %d: %v", pid, err)
	}
	proctreetest.WaitDead(t, "the whole tree is killed", pid)
}

// TestAuto: Auto takes a cgroup where the machine allows it, else the
// subreaper with a shim, else the process group.
func TestAuto(t *testing.T) {
	t.Parallel()
	shim, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	withShim, withoutShim := Subreaper, Group
	if _, err := New(Config{Containment: Cgroup}); err == nil {
		withShim, withoutShim = Cgroup, Cgroup
	}
	for _, tc := range []struct {
		cfg  Config
		want Containment
	}{
		{Config{Shim: shim}, withShim},
		{Config{Containment: Auto, Shim: shim}, withShim},
		{Config{}, withoutShim},
	} {
		s, err := New(tc.cfg)
		if err != nil {
			t.Fatalf("New(%+v) = %v", tc.cfg, err)
		}
		if got := s.Containment(); got != tc.want {
			t.Errorf("New(%+v).Containment() = %s, want %s", tc.cfg, got, tc.want)
		}
	}
	if _, err := New(Config{Containment: Subreaper}); err == nil {
		t.Error("New(Subreaper without a shim) = nil, want an error")
	}
	if _, err := New(Config{Containment: "jail"}); err == nil {
		t.Error("New(jail) = nil, want an error")
	}
}
