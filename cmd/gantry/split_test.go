//go:build !windows

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// logWatch follows the JSON log of a gantry child process.
type logWatch struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []map[string]any
	done  chan struct{}
}

// watchGantry starts gantry with args and JSON logs, and follows its log.
func watchGantry(t *testing.T, args ...string) *logWatch {
	t.Helper()
	w := &logWatch{cmd: gantryCmd(t, append(args, "--log-format", "json")...), done: make(chan struct{})}
	stderr, err := w.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l map[string]any
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				w.mu.Lock()
				w.lines = append(w.lines, l)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
		_ = w.cmd.Wait()
	})
	return w
}

// wait polls the log until a line with msg (and every key=value of attrs)
// shows up, and returns it.
func (w *logWatch) wait(t *testing.T, within time.Duration, msg string, attrs ...string) map[string]any {
	t.Helper()
	var found map[string]any
	poll.For(t, within, 20*time.Millisecond, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, l := range w.lines {
			if l["msg"] != msg {
				continue
			}
			ok := true
			for i := 0; i+1 < len(attrs); i += 2 {
				ok = ok && l[attrs[i]] == attrs[i+1]
			}
			if ok {
				found = l
				return nil
			}
		}
		return fmt.Errorf("no log line %q %v (%d lines)", msg, attrs, len(w.lines))
	})
	return found
}

// TestSplitComponents runs the system as on several machines: a worker
// started before its broker waits for it, saying so; the broker names who
// uses the config sections it does not; the worker's keeper registers the
// config's resources; a broker outage is logged with the server's URL on
// loss and return; a worker that never finds a broker gives up after
// --connect-timeout.
func TestSplitComponents(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	url := "nats://" + addr
	cfg := writeConfig(t, "resources:\n  - {id: cam7}\nworkers:\n  task_retention: 2d\n")
	data := t.TempDir()

	worker := watchGantry(t, "worker", "--server", url, "--config", cfg, "--connect-timeout", "30s")
	// Durations read as Go durations in the JSON log, not nanoseconds.
	worker.wait(t, 10*time.Second, "waiting for the broker", "server", url, "connect_timeout", "30s")

	broker := watchGantry(t, "broker", "--nats-listen", addr, "--http-listen", "", "--data", data, "--config", cfg)
	broker.wait(t, 10*time.Second, readyMsg)
	broker.wait(t, time.Second, "config section not used by this command", "section", "resources", "used_by", "gantry worker (its keeper registers them)")
	worker.wait(t, 15*time.Second, readyMsg)

	poll.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if _, out, _ := runBinary(t, "resource", "ls", "--server", url); !strings.Contains(out, "cam7") {
			return fmt.Errorf("resource ls = %q, want cam7 registered by the worker's keeper", out)
		}
		return nil
	})

	// A broker outage: the worker says it lost the broker, and that it is
	// back, naming it.
	if err := broker.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-broker.done
	worker.wait(t, 10*time.Second, "broker connection lost; reconnecting", "server", url)
	broker2 := watchGantry(t, "broker", "--nats-listen", addr, "--http-listen", "", "--data", data)
	broker2.wait(t, 10*time.Second, readyMsg)
	worker.wait(t, 10*time.Second, "broker connection back", "server", url)

	// The config file's workers section reaches the split worker: a
	// finished task's record is kept for its task_retention (2d), not the
	// default 7 days.
	if got := submitWait(t, url, "noop", "--id", "split-retention"); got != "SUCCEEDED" {
		t.Fatalf("noop ended %s, want SUCCEEDED", got)
	}
	_, js := brokertest.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, "KV_"+wire.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := stream.GetLastMsgForSubject(ctx, "$KV."+wire.BucketTasks+".split-retention")
	if err != nil {
		t.Fatal(err)
	}
	if ttl := rec.Header.Get(jetstream.MsgTTLHeader); ttl != strconv.Itoa(2*24*3600) {
		t.Errorf("finished record's %s = %q, want %d (task_retention: 2d from --config)", jetstream.MsgTTLHeader, ttl, 2*24*3600)
	}

	// No broker at all: the worker gives up after --connect-timeout.
	start := time.Now()
	code, _, stderr := runBinary(t, "worker", "--server", "nats://"+freePort(t), "--connect-timeout", "1s", "--log-format", "json")
	if took := time.Since(start); code != exitFailure || !strings.Contains(stderr, "no broker answered") || took > 5*time.Second {
		t.Errorf("worker without a broker = exit %d after %v, stderr %q; want exit 1 within about 1s saying no broker answered", code, took, stderr)
	}
	if !strings.Contains(stderr, strconv.Quote("waiting for the broker")) {
		t.Errorf("worker without a broker logged %q, want a line saying it waits for the broker", stderr)
	}
}
