//go:build unix

package proctree

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
)

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// containments are the containments this operating system has.
func containments() []Containment {
	if runtime.GOOS == "linux" {
		return []Containment{Group, Cgroup, Subreaper}
	}
	return []Containment{Group}
}

// starter returns a Starter of containment c, with the test binary as its
// shim. A Cgroup the machine does not allow skips the test, saying why.
func starter(t *testing.T, c Containment) *Starter {
	t.Helper()
	shim, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Containment: c, Shim: shim})
	if c == Cgroup && err != nil {
		t.Skipf("cgroup v2 containment is not allowed on this machine (the Subreaper tests cover Linux): %v", err)
	}
	if err != nil {
		t.Fatalf("New(%s) = %v", c, err)
	}
	if got := s.Containment(); got != c {
		t.Fatalf("Containment = %s, want %s", got, c)
	}
	return s
}

// forEach runs f as a parallel subtest for each containment.
func forEach(t *testing.T, f func(t *testing.T, s *Starter)) {
	t.Helper()
	for _, c := range containments() {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			f(t, starter(t, c))
		})
	}
}

// start starts cmd as a tree, killed and waited for if the test leaves it.
func start(t *testing.T, s *Starter, cmd *exec.Cmd) *Tree {
	t.Helper()
	tree, err := s.Start(cmd)
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = tree.Kill()
			_ = tree.Wait()
		}
	})
	return tree
}

// wait waits for tree with a deadline and returns Wait's error.
func wait(t *testing.T, tree *Tree) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- tree.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Wait did not return within 20s")
		return nil
	}
}

// treeScript runs a child shell that runs a grandchild sleep; the root,
// the child and the grandchild write their pids to $PIDS.
const treeScript = `echo $$ >> "$PIDS"
sh -c 'echo $$ >> "$PIDS"; sleep 300 & echo $! >> "$PIDS"; wait' &
wait`

// graceScript runs a child shell; on signal $SIG the child touches $MARK
// and exits 0, and the root waits for it and exits 42. The child touches
// $READY once both have set their traps.
const graceScript = `trap 'wait; exit 42' "$SIG"
sh -c 'trap "touch \"\$MARK\"; exit 0" "$SIG"; touch "$READY"; while :; do sleep 0.05; done' &
while :; do sleep 0.05; done`

// shell returns sh -c script with env added to the environment.
func shell(ctx context.Context, script string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

func TestKillKillsTree(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		pidFile := filepath.Join(t.TempDir(), "pids")
		cmd := shell(context.Background(), treeScript, "PIDS="+pidFile)
		tree := start(t, s, cmd)
		pids := proctreetest.ReadPids(t, pidFile, 3)
		if err := tree.Kill(); err != nil {
			t.Fatalf("Kill = %v, want nil", err)
		}
		var ee *exec.ExitError
		if err := wait(t, tree); !errors.As(err, &ee) {
			t.Fatalf("Wait = %v, want an *exec.ExitError", err)
		}
		if got := ExitStatus(cmd.ProcessState); got != 128+int(syscall.SIGKILL) {
			t.Errorf("ExitStatus = %d, want %d", got, 128+int(syscall.SIGKILL))
		}
		proctreetest.WaitDead(t, "the whole tree is killed", pids...)
		if err := tree.Kill(); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("Kill after Wait = %v, want os.ErrProcessDone", err)
		}
		if err := tree.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("Signal after Wait = %v, want os.ErrProcessDone", err)
		}
	})
}

func TestSignalReachesTree(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		dir := t.TempDir()
		mark, ready := filepath.Join(dir, "mark"), filepath.Join(dir, "ready")
		cmd := shell(context.Background(), graceScript, "SIG=USR1", "MARK="+mark, "READY="+ready)
		tree := start(t, s, cmd)
		proctreetest.WaitFile(t, ready)
		if err := tree.Signal(syscall.SIGUSR1); err != nil {
			t.Fatalf("Signal = %v, want nil", err)
		}
		_ = wait(t, tree)
		if got := ExitStatus(cmd.ProcessState); got != 42 {
			t.Errorf("ExitStatus = %d, want the trap's 42", got)
		}
		if !fileExists(mark) {
			t.Error("the child did not get the signal")
		}
	})
}

func TestCancelTerminatesTree(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		dir := t.TempDir()
		mark, ready := filepath.Join(dir, "mark"), filepath.Join(dir, "ready")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := shell(ctx, graceScript, "SIG=TERM", "MARK="+mark, "READY="+ready)
		const grace = time.Minute
		cmd.WaitDelay = grace
		tree := start(t, s, cmd)
		proctreetest.WaitFile(t, ready)
		began := time.Now()
		cancel()
		_ = wait(t, tree)
		if took := time.Since(began); took >= grace {
			t.Errorf("Wait after cancel took %v, want the tree to stop on SIGTERM before the %v grace", took, grace)
		}
		if got := ExitStatus(cmd.ProcessState); got != 42 {
			t.Errorf("ExitStatus = %d, want the trap's 42", got)
		}
		if !fileExists(mark) {
			t.Error("the child did not get SIGTERM")
		}
	})
}

func TestCancelKillsAfterGrace(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		pidFile := filepath.Join(t.TempDir(), "pids")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// SIGTERM is ignored by the root and, inherited, by the child.
		cmd := shell(ctx, `trap '' TERM; `+treeScript, "PIDS="+pidFile)
		const grace = 300 * time.Millisecond
		cmd.WaitDelay = grace
		tree := start(t, s, cmd)
		pids := proctreetest.ReadPids(t, pidFile, 3)
		began := time.Now()
		cancel()
		_ = wait(t, tree)
		if took := time.Since(began); took < grace {
			t.Errorf("Wait after cancel took %v, want the %v grace before the kill", took, grace)
		}
		if got := ExitStatus(cmd.ProcessState); got != 128+int(syscall.SIGKILL) {
			t.Errorf("ExitStatus = %d, want %d", got, 128+int(syscall.SIGKILL))
		}
		proctreetest.WaitDead(t, "the whole tree is killed", pids...)
	})
}

func TestCancelWithoutWaitDelayKills(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		pidFile := filepath.Join(t.TempDir(), "pids")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := shell(ctx, `trap '' TERM; `+treeScript, "PIDS="+pidFile)
		tree := start(t, s, cmd)
		pids := proctreetest.ReadPids(t, pidFile, 3)
		cancel()
		_ = wait(t, tree)
		if got := ExitStatus(cmd.ProcessState); got != 128+int(syscall.SIGKILL) {
			t.Errorf("ExitStatus = %d, want %d", got, 128+int(syscall.SIGKILL))
		}
		proctreetest.WaitDead(t, "the whole tree is killed", pids...)
	})
}

func TestExitStatus(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		for _, tc := range []struct {
			script string
			want   int
		}{
			{"exit 0", 0},
			{"exit 3", 3},
			{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
			{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
		} {
			t.Run(tc.script, func(t *testing.T) {
				t.Parallel()
				cmd := shell(context.Background(), tc.script)
				err := wait(t, start(t, s, cmd))
				var ee *exec.ExitError
				if (tc.want == 0) != (err == nil) || (err != nil && !errors.As(err, &ee)) {
					t.Errorf("Wait = %v, want nil for status 0 and an *exec.ExitError otherwise", err)
				}
				if got := ExitStatus(cmd.ProcessState); got != tc.want {
					t.Errorf("ExitStatus = %d, want %d", got, tc.want)
				}
			})
		}
	})
}

func TestWaitKillsLeftovers(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		// The background sleep holds stdout, a pipe: Wait returns when the
		// shell exits all the same, and the sleep is killed.
		cmd := shell(context.Background(), `sleep 300 & echo $!`)
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := wait(t, start(t, s, cmd)); err != nil {
			t.Fatalf("Wait = %v, want nil", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
		if err != nil {
			t.Fatalf("output = %q, want the background pid", out.String())
		}
		proctreetest.WaitDead(t, "the whole tree is killed", pid)
	})
}

func TestStreams(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		t.Run("shared stdout and stderr", func(t *testing.T) {
			t.Parallel()
			cmd := shell(context.Background(), `echo out; echo err >&2; echo out`)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := wait(t, start(t, s, cmd)); err != nil {
				t.Fatalf("Wait = %v, want nil", err)
			}
			if got, want := out.String(), "out\nerr\nout\n"; got != want {
				t.Errorf("output = %q, want %q", got, want)
			}
		})
		t.Run("separate stdout and stderr", func(t *testing.T) {
			t.Parallel()
			cmd := shell(context.Background(), `echo out; echo err >&2`)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := wait(t, start(t, s, cmd)); err != nil {
				t.Fatalf("Wait = %v, want nil", err)
			}
			if stdout.String() != "out\n" || stderr.String() != "err\n" {
				t.Errorf("stdout, stderr = %q, %q, want %q, %q", stdout.String(), stderr.String(), "out\n", "err\n")
			}
		})
		t.Run("stdin", func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("cat")
			var out bytes.Buffer
			cmd.Stdin, cmd.Stdout = strings.NewReader("hello\n"), &out
			if err := wait(t, start(t, s, cmd)); err != nil {
				t.Fatalf("Wait = %v, want nil", err)
			}
			if got := out.String(); got != "hello\n" {
				t.Errorf("output = %q, want %q", got, "hello\n")
			}
		})
		t.Run("stdin not read", func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("true")
			cmd.Stdin = bytes.NewReader(make([]byte, 1<<20))
			if err := wait(t, start(t, s, cmd)); err != nil {
				t.Errorf("Wait = %v, want nil: input the command did not read is not an error", err)
			}
		})
		t.Run("environment and dir", func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := shell(context.Background(), `echo "$GREETING"; pwd`, "GREETING=hello")
			cmd.Dir = dir
			var out bytes.Buffer
			cmd.Stdout = &out
			if err := wait(t, start(t, s, cmd)); err != nil {
				t.Fatalf("Wait = %v, want nil", err)
			}
			if got, want := out.String(), "hello\n"+dir+"\n"; got != want {
				t.Errorf("output = %q, want %q", got, want)
			}
		})
	})
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	plain := write("plain.sh", "#!/bin/sh\nexit 0\n", 0o644)
	badInterp := write("bad-interp.sh", "#!/no/such/interpreter\nexit 0\n", 0o755)
	forEach(t, func(t *testing.T, s *Starter) {
		for _, tc := range []struct {
			name string
			cmd  func() *exec.Cmd
			want error
			msg  string
		}{
			{"missing path", func() *exec.Cmd { return exec.Command(filepath.Join(dir, "missing.sh")) }, ErrNotFound, "missing.sh: not found"},
			{"missing relative path", func() *exec.Cmd {
				c := exec.Command("./missing.sh")
				c.Dir = dir
				return c
			}, ErrNotFound, "./missing.sh: not found"},
			{"not in PATH", func() *exec.Cmd { return exec.Command("gantry-no-such-program") }, ErrNotFound, "gantry-no-such-program: not found in $PATH"},
			{"no execute permission", func() *exec.Cmd { return exec.Command(plain) }, ErrNotExecutable, "plain.sh: not executable"},
			{"directory", func() *exec.Cmd { return exec.Command(dir) }, ErrNotExecutable, "not executable (a directory)"},
			{"missing interpreter", func() *exec.Cmd { return exec.Command(badInterp) }, ErrNotExecutable, "bad-interp.sh: not executable"},
			{"missing dir", func() *exec.Cmd {
				c := exec.Command("true")
				c.Dir = filepath.Join(dir, "nowhere")
				return c
			}, ErrBadDir, "nowhere: no such directory"},
			{"dir is a file", func() *exec.Cmd {
				c := exec.Command("true")
				c.Dir = plain
				return c
			}, ErrBadDir, "plain.sh: not a directory"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				cmd := tc.cmd()
				var out bytes.Buffer
				cmd.Stdout = &out
				tree, err := s.Start(cmd)
				if err == nil {
					_ = tree.Wait()
					t.Fatalf("Start = nil, want %v", tc.want)
				}
				if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("Start = %v, want %v saying %q", err, tc.want, tc.msg)
				}
			})
		}
	})
}

func TestStartRefusesSysProcAttr(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, s *Starter) {
		cmd := exec.Command("true")
		cmd.SysProcAttr = &syscall.SysProcAttr{}
		if _, err := s.Start(cmd); err == nil || cmd.Process != nil {
			t.Errorf("Start with SysProcAttr set = %v, want an error and no process", err)
		}
	})
}
