package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// stopGantry ends a gantry process with SIGTERM and waits for it.
func stopGantry(t *testing.T, c *exec.Cmd) {
	t.Helper()
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, c); code != exitOK {
		t.Fatalf("gantry after SIGTERM = exit %d, want 0", code)
	}
}

// subjectCount is how many messages stream holds on subject.
func subjectCount(t *testing.T, js jetstream.JetStream, stream, subject string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Subjects[subject])
}

// quarantined returns the buckets and keys of the VALUE_QUARANTINED events
// in the audit stream, as "bucket/key".
func quarantined(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var out []string
	for _, m := range streamMsgs(t, js, wire.StreamAudit, wire.EventValueQuarantined.Subject()) {
		var ev wire.Event
		var p struct{ Bucket, Key string }
		if json.Unmarshal(m.Data, &ev) == nil && json.Unmarshal(ev.Payload, &p) == nil {
			out = append(out, p.Bucket+"/"+p.Key)
		}
	}
	return out
}

// TestRunSurvivesBadValues: any client may write any bytes into the
// buckets gantry reads. Each bad value is quarantined (a VALUE_QUARANTINED
// event), skipped or replaced, and every component carries on: gantry run
// restarts, the scheduler leads and fires again, a forged lease does not
// hold its resource, a task with a garbage record runs, and the listings
// show the bad entries instead of failing.
func TestRunSurvivesBadValues(t *testing.T) {
	t.Parallel()
	site := okSite(t)
	cfg := writeConfig(t, fmt.Sprintf("routes:\n  - {id: r1, probe_url: %q}\nresources:\n  - {id: cam1}\njobs:\n  - {name: tick, type: noop, every: 1s}\n", site.URL))
	data := filepath.Join(t.TempDir(), "data")
	args := []string{"run", "--data", data, "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg, "--backoff-base", "3s"}
	c, ready := startGantry(t, args...)
	_, js := brokertest.Connect(t, ready.NATS)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	put := func(bucket, key, value string) {
		t.Helper()
		b, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Put(ctx, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	fired := func() int { return subjectCount(t, js, wire.StreamAudit, wire.EventJobFired.Subject()) }
	poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		if fired() == 0 {
			return fmt.Errorf("tick not fired yet")
		}
		return nil
	})

	// Garbage over what every component reads, without the TTLs gantry
	// writes with.
	put(wire.BucketScheduler, "leader", "x")
	put(wire.BucketScheduler, "term", "not a number")
	put(wire.BucketResources, "cam1", "garbage")
	put(wire.BucketLeases, "cam2", "{}")
	put(wire.BucketLeases, "cam3", `{"resource":"cam3","owner":"mallory","ttl":"30s","expires_at":"2099-01-01T00:00:00Z"}`)
	put(wire.BucketRoutes, "r9", "garbage")

	// The scheduler leads again and fires.
	before := fired()
	poll.For(t, 30*time.Second, 200*time.Millisecond, func() error {
		if n := fired(); n <= before+1 {
			return fmt.Errorf("JOB_FIRED events = %d, want more than %d", n, before+1)
		}
		return nil
	})
	// A forged lease, without the broker's TTL, does not hold its resource.
	for _, res := range []string{"cam2", "cam3"} {
		if code, _, errs := leaseCLI(t, ready.NATS, "lease", "acquire", res, "--owner", "alice", "--ttl", "5s"); code != exitOK {
			t.Errorf("lease acquire %s over a forged lease = exit %d (%s), want 0", res, code, errs)
		}
	}
	// A task whose record is made garbage while it waits for its retry
	// runs when redelivered.
	marker := filepath.Join(t.TempDir(), "failed-once")
	task := fmt.Sprintf(`{"id":"t-bad","payload":{"cmd":["sh","-c","test -f %s || { touch %s; exit 1; }"]}}`, marker, marker)
	if _, err := js.Publish(ctx, wire.TaskSubject("", "exec"), []byte(task)); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		code, out, errs := leaseCLI(t, ready.NATS, "task", "get", "t-bad", "--json")
		if code != exitOK || !strings.Contains(out, `"RETRY_WAIT"`) {
			return fmt.Errorf("task get t-bad = exit %d %s %s", code, out, errs)
		}
		return nil
	})
	put(wire.BucketTasks, "t-bad", "garbage")
	poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		code, out, errs := leaseCLI(t, ready.NATS, "task", "get", "t-bad", "--json")
		if code != exitOK || !strings.Contains(out, `"SUCCEEDED"`) {
			return fmt.Errorf("task get t-bad = exit %d %s %s", code, out, errs)
		}
		return nil
	})
	// The listings show the bad entries.
	code, out, errs := leaseCLI(t, ready.NATS, "resource", "ls", "--json")
	if code != exitOK || !strings.Contains(out, `"cam1"`) || !strings.Contains(out, `"FAULT"`) {
		t.Errorf("resource ls = exit %d %s %s; want cam1 listed FAULT", code, out, errs)
	}
	code, out, errs = leaseCLI(t, ready.NATS, "route", "ls", "--json")
	if code != exitOK || !strings.Contains(out, `"r9"`) || !strings.Contains(out, `"r1"`) {
		t.Errorf("route ls = exit %d %s %s; want r1 and r9 listed", code, out, errs)
	}

	// gantry run starts again over the garbage resource of its config.
	stopGantry(t, c)
	c, ready = startGantry(t, args...)
	_, js = brokertest.Connect(t, ready.NATS)
	code, out, errs = leaseCLI(t, ready.NATS, "resource", "ls", "--json")
	if code != exitOK || !strings.Contains(out, `"cam1"`) || !strings.Contains(out, `"AVAILABLE"`) {
		t.Errorf("resource ls after restart = exit %d %s %s; want cam1 registered again, AVAILABLE", code, out, errs)
	}
	poll.For(t, 10*time.Second, 200*time.Millisecond, func() error {
		got := quarantined(t, js)
		for _, want := range []string{"gantry_scheduler/leader", "gantry_scheduler/term", "gantry_resources/cam1",
			"gantry_leases/cam2", "gantry_leases/cam3", "gantry_tasks/t-bad"} {
			if !slices.Contains(got, want) {
				return fmt.Errorf("VALUE_QUARANTINED for %v, want one for %s", got, want)
			}
		}
		return nil
	})
	stopGantry(t, c)
}

// readyz returns the status and body of gantry's /readyz.
func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRunRecreatesTheTasksStream: the tasks stream deleted behind gantry's
// back is not a silent stop: /readyz says the workers' consumer is gone
// until it is recreated, as provisioned, and tasks run again.
func TestRunRecreatesTheTasksStream(t *testing.T) {
	t.Parallel()
	c, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0")
	_, js := brokertest.Connect(t, ready.NATS)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code, body := readyz(t, ready.HTTP); code != http.StatusOK {
		t.Fatalf("/readyz = %d %q, want 200", code, body)
	}
	if err := js.DeleteStream(ctx, wire.StreamTasks); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 15*time.Second, 50*time.Millisecond, func() error {
		if code, body := readyz(t, ready.HTTP); code != http.StatusServiceUnavailable || !strings.Contains(body, "workers") {
			return fmt.Errorf("/readyz = %d %q, want 503 naming the workers", code, body)
		}
		return nil
	})
	poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		if code, body := readyz(t, ready.HTTP); code != http.StatusOK {
			return fmt.Errorf("/readyz = %d %q, want 200 again", code, body)
		}
		return nil
	})
	if _, err := js.Publish(ctx, wire.TaskSubject("", "noop"), []byte(`{"id":"after-rm"}`)); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		if code, out, _ := leaseCLI(t, ready.NATS, "task", "get", "after-rm", "--json"); code != exitOK || !strings.Contains(out, `"SUCCEEDED"`) {
			return fmt.Errorf("task get after-rm = exit %d %s", code, out)
		}
		return nil
	})
	stopGantry(t, c)
}
