package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// nodeExampleDir holds the Node handler example that docs/tasks.md shows.
var nodeExampleDir = filepath.Join("..", "..", "examples", "handlers", "node")

// needNode skips the test, loudly, when node or the example's modules are
// missing here; in CI (CI set) it fails instead.
func needNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeExampleDir, "node_modules", "@nats-io", "transport-node", "package.json"))
	}
	if err != nil {
		msg := fmt.Sprintf("THE NODE HANDLER EXAMPLE IS NOT TESTED: %v (install node and npm, then run 'make node-examples')", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI is set, so this fails")
		}
		t.Skip(msg)
	}
	return node
}

// nodeProc is a node script running as a child process.
type nodeProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

// startNode runs `node script args...` in the example's directory against
// url, logging its stderr.
func startNode(t *testing.T, node, url, script string, args ...string) *nodeProc {
	t.Helper()
	p := &nodeProc{cmd: exec.Command(node, append([]string{script}, args...)...), done: make(chan struct{})}
	p.cmd.Dir = nodeExampleDir
	p.cmd.Env = append(os.Environ(), "NATS_URL="+url)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = &testLog{t: t, prefix: script + ": "}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
			_ = p.cmd.Wait()
		}
	})
	return p
}

func (p *nodeProc) stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// wait waits for the process to exit and returns its exit code.
func (p *nodeProc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%v did not exit within %v; printed %q", p.cmd.Args, within, p.stdout())
	}
	err := p.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", p.cmd.Args, err)
	}
	return 0
}

// testLog writes lines to the test's log.
type testLog struct {
	t      *testing.T
	prefix string
}

func (l *testLog) Write(p []byte) (int, error) {
	l.t.Log(l.prefix + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startHandler starts handler.mjs and waits until it listens.
func startHandler(t *testing.T, node, url string) *nodeProc {
	t.Helper()
	h := startNode(t, node, url, "handler.mjs")
	poll.That(t, 20*time.Second, "handler.mjs to print ready", func() bool { return strings.HasPrefix(h.stdout(), "ready\n") })
	return h
}

// submitted is one line submit.mjs prints.
type submitted struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Attempts int    `json:"attempts"`
}

func parseSubmitted(t *testing.T, out string) []submitted {
	t.Helper()
	var got []submitted
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var s submitted
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatalf("submit.mjs printed %q: %v", l, err)
		}
		got = append(got, s)
	}
	return got
}

func TestNodeHandlerExample(t *testing.T) {
	t.Parallel()
	node := needNode(t)
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	startHandler(t, node, url)
	s := startNode(t, node, url, "submit.mjs", "4", "node-ok", "3", "50")
	if code := s.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("submit.mjs = exit %d, printed %q; want 0", code, s.stdout())
	}
	got := parseSubmitted(t, s.stdout())
	if len(got) != 4 {
		t.Fatalf("submit.mjs printed %d tasks, want 4: %q", len(got), s.stdout())
	}
	for _, g := range got {
		if g.State != string(wire.TaskSucceeded) || g.Attempts != 1 {
			t.Errorf("task %s = %s after %d attempts, want SUCCEEDED after 1", g.ID, g.State, g.Attempts)
		}
	}
	// The reply's body is the task's output.
	rec := taskJSON(t, url, "node-ok-1")
	if rec.Output != `{"resized":"node-ok-1","steps":3}` {
		t.Errorf("output = %q, want the handler's reply", rec.Output)
	}
}

// TestNodeHandlerKilledAndRestarted: a handler killed mid-stream, with tasks
// in its hands, and started again: every task still succeeds.
func TestNodeHandlerKilledAndRestarted(t *testing.T) {
	t.Parallel()
	node := needNode(t)
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "",
		"--handler-heartbeat-window", "1s", "--no-handler-delay", "300ms", "--backoff-base", "200ms")
	url := ready.NATS
	h := startHandler(t, node, url)
	// The worker passes on each task's progress lines: once every task has
	// one, every task is in the handler's hands and has sent a heartbeat.
	nc, _ := brokertest.Connect(t, url)
	var mu sync.Mutex
	progressed := map[string]bool{}
	sub, err := nc.Subscribe(wire.SubjectOutputAll, func(m *nats.Msg) {
		var l wire.OutputLine
		if json.Unmarshal(m.Data, &l) == nil && l.Stream == wire.OutputHandler {
			mu.Lock()
			progressed[l.TaskID] = true
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const n = 12
	s := startNode(t, node, url, "submit.mjs", fmt.Sprint(n), "node-kill", "20", "150")
	poll.That(t, 20*time.Second, "every task to be in the handler's hands", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(progressed) == n
	})
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	h.wait(t, 10*time.Second)
	killedAt := time.Now()
	// Tasks find no handler for a moment.
	poll.That(t, 20*time.Second, "a task to wait for a handler", func() bool {
		page, _, _ := queryJSON(t, url, "--type", string(wire.EventRetryScheduled), "--limit", "1000")
		for _, ev := range page.Events {
			if strings.Contains(ev.Message, "no handler answered") {
				return true
			}
		}
		return false
	})
	startHandler(t, node, url)
	if code := s.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("submit.mjs = exit %d, printed %q; want 0 (every task SUCCEEDED)", code, s.stdout())
	}
	got := parseSubmitted(t, s.stdout())
	retried := 0
	for _, g := range got {
		if g.State != string(wire.TaskSucceeded) {
			t.Errorf("task %s = %s, want SUCCEEDED", g.ID, g.State)
		}
		if g.Attempts > 1 {
			retried++
		}
	}
	if len(got) != n || retried != n {
		t.Errorf("submit.mjs: %d tasks, %d retried; want %d, all retried after the kill", len(got), retried, n)
	}
	// The tasks in the dead handler's hands were given up within seconds
	// of its last heartbeat, not at their 10 minute timeout.
	page, _, _ := queryJSON(t, url, "--type", string(wire.EventRetryScheduled), "--limit", "1000")
	silent := 0
	for _, ev := range page.Events {
		if strings.Contains(ev.Message, "stopped sending heartbeats") {
			silent++
			if ev.Time.Sub(killedAt) > 5*time.Second {
				t.Errorf("%s given up at %v, %v after the kill; want within seconds", ev.TaskID, ev.Time, ev.Time.Sub(killedAt))
			}
		}
	}
	if silent == 0 {
		t.Errorf("no RETRY_SCHEDULED says a handler stopped sending heartbeats; events %v", page.Events)
	}
}

// TestDocsShowNodeHandler: docs/tasks.md shows handler.mjs as it is.
func TestDocsShowNodeHandler(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile(filepath.Join(nodeExampleDir, "handler.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "tasks.md"))
	if err != nil {
		t.Fatal(err)
	}
	const start = "<!-- examples/handlers/node/handler.mjs -->\n```js\n"
	_, rest, ok := strings.Cut(string(doc), start)
	snippet, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatalf("docs/tasks.md has no %q block", start)
	}
	if snippet != string(file) {
		t.Errorf("docs/tasks.md shows a handler.mjs that differs from examples/handlers/node/handler.mjs: copy the file into the doc")
	}
}
