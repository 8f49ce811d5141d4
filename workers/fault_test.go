//go:build unix

package workers

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
)

// hugeOutputMB is how many MB an exec task writes in TestExecHugeOutput:
// 100, or GANTRY_HUGE_OUTPUT_MB.
func hugeOutputMB(t *testing.T) int {
	t.Helper()
	mb := 100
	if s := os.Getenv("GANTRY_HUGE_OUTPUT_MB"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("GANTRY_HUGE_OUTPUT_MB = %q, want a positive number", s)
		}
		mb = n
	}
	return mb
}

// heapPeak samples the heap in use until stop is called, and returns the
// highest figure seen.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}

// TestExecHugeOutput: an exec task writes 100 MB (GANTRY_HUGE_OUTPUT_MB):
// most of it as 1000-byte lines on stdout, a fifth as one line without an
// end on stderr. The task finishes, the worker's heap stays bounded (it
// keeps a tail, never the output), the record and its events stay small,
// and the live output is rate-bound. Not parallel, so that the heap figure
// is the task's alone.
func TestExecHugeOutput(t *testing.T) {
	mb := hugeOutputMB(t)
	b := setup(t)
	b.start(t, Config{}, nil)
	l := b.watchOutput(t, "huge-1")
	lineMB, blobMB := mb-mb/5, mb/5
	script := fmt.Sprintf(`yes "$(printf '%%0999d' 7)" | head -c %d; head -c %d /dev/zero | tr '\0' x >&2; echo done`, lineMB<<20, blobMB<<20)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := heapPeak()
	start := time.Now()
	b.publish(t, wire.TaskSubject("", "exec"), map[string]any{"id": "huge-1",
		"payload": map[string]any{"cmd": []string{"sh", "-c", script}}})
	rec := b.waitState(t, "huge-1", wire.TaskSucceeded, 2*time.Minute)
	took := time.Since(start)
	peak := stop()
	growth := int64(peak) - int64(before.HeapInuse)
	t.Logf("%d MB of output in %v: heap in use %d MB before, peak %d MB (growth %d MB)",
		mb, took.Round(time.Millisecond), before.HeapInuse>>20, peak>>20, growth>>20)
	if growth > 64<<20 {
		t.Errorf("heap growth while the task wrote %d MB = %d MB, want at most 64 MB (a bounded tail)", mb, growth>>20)
	}

	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	// A tail of each stream, each marked cut, and the line between them.
	if len(data) > 64<<10 || len(rec.Output) > 2*(4096+len("…"))+len("\n--- stderr ---\n") {
		t.Errorf("record = %d bytes, output %d bytes; want the record under 64 KiB, the output a tail of 4 KiB a stream", len(data), len(rec.Output))
	}
	b.waitEvents(t, "huge-1", wire.EventTaskFinished, 1, 10*time.Second)
	b.mu.Lock()
	for _, ev := range b.events {
		if data, _ := json.Marshal(ev); ev.TaskID == "huge-1" && len(data) > 64<<10 {
			t.Errorf("event %s = %d bytes, want under 64 KiB", ev.Type, len(data))
		}
	}
	b.mu.Unlock()
	got := l.snapshot()
	published, dropped := 0, 0
	for _, x := range got {
		published += len(x.Line)
		dropped += x.Dropped
		if len(x.Line) > 1024 {
			t.Errorf("live line of %d bytes, want at most the 1024 line bound", len(x.Line))
		}
	}
	t.Logf("live output: %d lines published (%d KB), %d dropped by the rate bound", len(got), published>>10, dropped)
	if dropped == 0 {
		t.Errorf("live lines dropped = 0 of %d published, want the rate bound to drop most", len(got))
	}
}

// TestHandlerThatNeverAnswers: a remote handler takes every request and
// never replies, not even a heartbeat. Each attempt ends at the task's
// timeout as a retryable failure, the retries are bounded by max_attempts
// and the task goes to NEEDS_REVIEW saying it timed out; meanwhile the
// worker, with only three task slots, keeps running other tasks.
func TestHandlerThatNeverAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var requests atomic.Int32
	sub, err := b.env.NC.Subscribe(wire.HandlerSubject("mute"), func(*nats.Msg) { requests.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	b.start(t, Config{Queues: []Queue{{Name: "default", Concurrency: 3}},
		Policy: Policy{MaxAttempts: 2, BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond}}, nil)
	for i := range 2 {
		b.publish(t, wire.TaskSubject("", "mute"), fmt.Sprintf(`{"id":"mute-%d","timeout":"400ms"}`, i))
	}
	for i := range 20 {
		b.publish(t, wire.TaskSubject("", "noop"), fmt.Sprintf(`{"id":"other-%d"}`, i))
	}
	for i := range 20 {
		b.waitState(t, fmt.Sprintf("other-%d", i), wire.TaskSucceeded, 20*time.Second)
	}
	for i := range 2 {
		id := fmt.Sprintf("mute-%d", i)
		rec := b.waitState(t, id, wire.TaskNeedsReview, 20*time.Second)
		if rec.Attempts != 2 || !strings.Contains(rec.LastError, "deadline exceeded") && !strings.Contains(rec.LastError, "timed out") {
			t.Errorf("%s record = attempts %d, last error %q; want 2 attempts ending in a timeout", id, rec.Attempts, rec.LastError)
		}
		if evs := b.eventsOf(id, wire.EventRetryScheduled); len(evs) != 1 {
			t.Errorf("%s RETRY_SCHEDULED events = %d, want 1", id, len(evs))
		}
	}
	if n := requests.Load(); n != 4 {
		t.Errorf("requests to the mute handler = %d, want 4 (2 tasks × 2 attempts)", n)
	}
	// Still not wedged: a task after the reviews runs too.
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"after"}`)
	b.waitState(t, "after", wire.TaskSucceeded, 10*time.Second)
}
