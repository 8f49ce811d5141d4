package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a gantry process a test started: its log is in t.Log, prefixed
// with its name, and kept for the test to search.
type proc struct {
	name  string
	cmd   *exec.Cmd
	ready chan logLine
	done  chan struct{}

	mu    sync.Mutex
	lines []string
}

// spawn starts gantry with args (and JSON logs) as a child process, without
// waiting for it to be ready.
func spawn(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: gantryCmd(t, append(args, "--log-format", "json")...),
		ready: make(chan logLine, 1), done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == readyMsg {
				select {
				case p.ready <- l:
				default:
				}
			}
			t.Log(name + ": " + line)
		}
	}()
	return p
}

// waitReady waits for p's ready line.
func (p *proc) waitReady(t testing.TB, d time.Duration) logLine {
	t.Helper()
	select {
	case l := <-p.ready:
		return l
	case <-p.done:
		t.Fatalf("%s exited before it was ready", p.name)
	case <-time.After(d):
		t.Fatalf("%s: no ready line within %s", p.name, d)
	}
	return logLine{}
}

// stop sends SIGTERM and waits for the process to exit.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop within 15s of SIGTERM", p.name)
	}
	_ = p.cmd.Wait()
}

// kill ends the process at once (SIGKILL) and waits for it.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.cmd.Wait()
}

// logged returns the lines of p's log containing s.
func (p *proc) logged(s string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// addr formats a loopback host:port.
func addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
