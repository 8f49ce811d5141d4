package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/internal/pgtest"
	"github.com/gantry-dev/gantry/internal/proctree"
)

// pg is the PostgreSQL server of the sql tests, started by the first that
// needs it.
var pg pgtest.Shared

// TestMain runs gantry's main instead of the tests when GANTRY_TEST_MAIN is
// set, so tests can start the real binary as a child process, and the shim
// of a process tree when the binary is started as one.
func TestMain(m *testing.M) {
	proctree.ShimMain()
	if os.Getenv("GANTRY_TEST_MAIN") == "1" {
		main()
		return
	}
	goleak.VerifyTestMain(m, leaktest.Options(goleak.Cleanup(func(code int) {
		pg.Stop()
		os.Exit(code)
	}))...)
}

// gantryCmd returns the test binary re-executed as gantry with args.
func gantryCmd(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GANTRY_TEST_MAIN=1")
	return cmd
}

// runInProcess runs the CLI in this process and returns its exit code and
// output.
func runInProcess(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = Run(ctx, args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// logLine is the part of a JSON log line the tests read.
type logLine struct {
	Msg  string `json:"msg"`
	NATS string `json:"nats"`
	HTTP string `json:"http"`
}

// startGantry runs `gantry run` (or another serving command) as a child
// process and waits for its ready line, returning the line.
func startGantry(t testing.TB, args ...string) (*exec.Cmd, logLine) {
	t.Helper()
	return startGantryIn(t, "", args...)
}

// startGantryIn is startGantry with the child's working directory dir (""
// for this one's).
func startGantryIn(t testing.TB, dir string, args ...string) (*exec.Cmd, logLine) {
	t.Helper()
	cmd := gantryCmd(t, append(args, "--log-format", "json")...)
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	ready := make(chan logLine, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == readyMsg {
				ready <- l
			}
			t.Log(sc.Text())
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case l := <-ready:
		return cmd, l
	case <-time.After(20 * time.Second):
		t.Fatal("no ready line within 20s")
	}
	return nil, logLine{}
}

// exitOf waits for c and returns its exit code.
func exitOf(t *testing.T, c *exec.Cmd) int {
	t.Helper()
	done := make(chan struct{})
	go func() {
		_ = c.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("lease run did not exit within 30s")
	}
	return c.ProcessState.ExitCode()
}

// freePort returns a loopback address nothing listens on (for a moment).
func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
