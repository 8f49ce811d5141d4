package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/brokertest"
)

// benchJSON runs `gantry bench args... --json` through the real binary and
// decodes its report.
func benchJSON(t *testing.T, args ...string) benchReport {
	t.Helper()
	cmd := gantryCmd(t, append(append([]string{"bench"}, args...), "--json", "--max-wait", "2m")...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gantry bench %v: %v\n%s", args, err, stderr.String())
	}
	var rep benchReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("gantry bench %v printed no report: %v\n%s", args, err, out)
	}
	return rep
}

// checkRatio fails unless 0 < got < 10: a ratio against raw JetStream on
// the same server is positive, and gantry is not ten times faster than
// the broker it runs on.
func checkRatio(t *testing.T, name string, got float64) {
	t.Helper()
	if got <= 0 || got >= 10 {
		t.Errorf("%s = %v, want in (0, 10)", name, got)
	}
}

// TestBench runs each scenario's short form against a gantry run that
// bench starts, and checks that the report adds up (no timing is
// asserted: the figures belong in docs/BENCHMARKS.md).
func TestBench(t *testing.T) {
	t.Parallel()
	linux := runtime.GOOS == "linux"
	started := func(t *testing.T, rep benchReport, scenario string) {
		t.Helper()
		if rep.Scenario != scenario || !rep.Started || !strings.HasPrefix(rep.Server, "nats://127.0.0.1:") || rep.ReadyMS <= 0 {
			t.Errorf("report = %q started %v at %q ready %v ms, want %q started on loopback", rep.Scenario, rep.Started, rep.Server, rep.ReadyMS, scenario)
		}
	}
	t.Run("throughput", func(t *testing.T) {
		t.Parallel()
		rep := benchJSON(t, "throughput", "--tasks", "300")
		started(t, rep, "throughput")
		r := rep.Throughput
		if r == nil || r.Tasks != 300 || r.Finished.Count != 300 || r.Raw.Count != 300 || r.Published.Count != 300 {
			t.Fatalf("throughput = %+v, want 300 tasks published, finished and raw", r)
		}
		checkRatio(t, "ratio", r.Ratio)
	})
	t.Run("latency", func(t *testing.T) {
		t.Parallel()
		rep := benchJSON(t, "latency", "--rate", "200", "--duration", "1s")
		started(t, rep, "latency")
		r := rep.Latency
		if r == nil || r.Tasks != 200 || r.SubmitToStart.Count != 200 || r.SubmitToFinish.Count != 200 || r.Raw.Count != 200 {
			t.Fatalf("latency = %+v, want 200 tasks started, finished and raw", r)
		}
		for _, q := range []struct {
			name string
			p50  float64
			p99  float64
			p999 float64
		}{{"submit_to_start", r.SubmitToStart.P50, r.SubmitToStart.P99, r.SubmitToStart.P999},
			{"submit_to_finish", r.SubmitToFinish.P50, r.SubmitToFinish.P99, r.SubmitToFinish.P999},
			{"raw", r.Raw.P50, r.Raw.P99, r.Raw.P999}} {
			if q.p50 <= 0 || q.p50 > q.p99 || q.p99 > q.p999 {
				t.Errorf("%s p50, p99, p99.9 = %v, %v, %v, want positive and ordered", q.name, q.p50, q.p99, q.p999)
			}
		}
		if r.SubmitToStart.P50 > r.SubmitToFinish.P50 {
			t.Errorf("submit_to_start p50 = %v > submit_to_finish p50 %v, want start first", r.SubmitToStart.P50, r.SubmitToFinish.P50)
		}
		if r.RatioP99 <= 0 {
			t.Errorf("ratio_p99 = %v, want > 0", r.RatioP99)
		}
	})
	t.Run("lease", func(t *testing.T) {
		t.Parallel()
		rep := benchJSON(t, "lease", "--duration", "500ms")
		started(t, rep, "lease")
		r := rep.Lease
		if r == nil || r.Cycles.Count < 1 || r.Events != 2*r.Cycles.Count || r.RawPuts.Count < 1 {
			t.Fatalf("lease = %+v, want cycles, two events a cycle, and raw puts", r)
		}
		checkRatio(t, "ratio", r.Ratio)
	})
	t.Run("audit", func(t *testing.T) {
		t.Parallel()
		rep := benchJSON(t, "audit", "--rate", "200", "--duration", "1s")
		started(t, rep, "audit")
		r := rep.Audit
		// Every TASK_FINISHED was seen, so it is in the window; events
		// published after the last of them (asynchronously) may not be.
		if r == nil || r.Tasks != 200 || r.Produced.Count < 200 || r.Stored.Count < 1 || r.BacklogAfter != 0 {
			t.Fatalf("audit = %+v, want 200 tasks, ≥ 200 events produced, some stored, no backlog after", r)
		}
		checkRatio(t, "ratio", r.Ratio)
	})
	t.Run("backlog", func(t *testing.T) {
		t.Parallel()
		rep := benchJSON(t, "backlog", "--tasks", "500")
		started(t, rep, "backlog")
		r := rep.Backlog
		if r == nil || r.Tasks != 500 || r.Drain.Count != 500 || r.RawDrain.Count != 500 || r.Idle.TaskMsgs < 500 {
			t.Fatalf("backlog = %+v, want 500 tasks queued in the stream, drained, and raw", r)
		}
		// A sample a loaded machine could not take is counted, not fatal.
		if linux && r.Missed == 0 && (r.Idle.RSSBytes <= 0 || r.PeakRSSBytes < r.Idle.RSSBytes) {
			t.Errorf("rss idle, peak = %d, %d, want positive, peak ≥ idle", r.Idle.RSSBytes, r.PeakRSSBytes)
		}
		checkRatio(t, "ratio", r.Ratio)
	})
	t.Run("soak", func(t *testing.T) {
		t.Parallel()
		rep := benchJSON(t, "soak", "--rate", "50", "--duration", "2s", "--sample-every", "500ms")
		started(t, rep, "soak")
		r := rep.Soak
		if r == nil || r.Tasks != 100 || r.Finished != 100 || len(r.Samples) < 2 {
			t.Fatalf("soak = %+v, want 100 tasks finished and at least 2 samples", r)
		}
		last := r.Samples[len(r.Samples)-1]
		if linux && (last.RSSBytes <= 0 || last.Goroutines <= 0 || last.OpenFDs <= 0) {
			t.Errorf("last sample = %+v, want RSS, goroutines and open files", last)
		}
		if got := last.AuditMsgs - r.Samples[0].AuditMsgs; r.Growth.AuditMsgs != got || got < 3*100 {
			t.Errorf("audit stream growth = %d (samples say %d), want ≥ 300", r.Growth.AuditMsgs, got)
		}
	})
}

// TestBenchServer: with --server bench measures an existing system (its
// /metrics with --metrics) and leaves no scratch stream or bucket behind.
func TestBenchServer(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0")
	rep := benchJSON(t, "lease", "--server", ready.NATS, "--duration", "300ms")
	if rep.Started || rep.Server != ready.NATS || rep.Lease == nil || rep.Lease.Events != 2*rep.Lease.Cycles.Count {
		t.Errorf("lease report = %+v, want the existing system measured, two events a cycle", rep)
	}
	rep = benchJSON(t, "backlog", "--server", ready.NATS, "--metrics", ready.HTTP+"/metrics", "--tasks", "200")
	if rep.Started || rep.Backlog == nil || rep.Backlog.Drain.Count != 200 {
		t.Fatalf("backlog report = %+v, want 200 tasks drained on the existing system", rep)
	}
	if runtime.GOOS == "linux" && rep.Backlog.Missed == 0 && rep.Backlog.Idle.RSSBytes <= 0 {
		t.Errorf("rss = %d, want the process's from --metrics", rep.Backlog.Idle.RSSBytes)
	}
	_, js := brokertest.Connect(t, ready.NATS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, "GANTRY_BENCH_") || strings.HasPrefix(name, "KV_gantry_bench_") {
			t.Errorf("stream %s left behind", name)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestBenchUsage: bench without a scenario is a usage error.
func TestBenchUsage(t *testing.T) {
	t.Parallel()
	cmd := gantryCmd(t, "bench")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Errorf("gantry bench = %v, want exit %d; output:\n%s", err, exitUsage, out)
	}
}
