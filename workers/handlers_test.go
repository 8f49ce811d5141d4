package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
)

// serve answers gantry.handlers.<typ> with h until the test ends.
func serve(t *testing.T, nc *nats.Conn, typ string, h nats.MsgHandler) *nats.Subscription {
	t.Helper()
	sub, err := nc.Subscribe(wire.HandlerSubject(typ), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// progress sends a progress message with body to m's reply subject.
func progress(m *nats.Msg, body string) {
	p := nats.NewMsg(m.Reply)
	p.Header.Set(wire.HeaderProgress, "1")
	p.Data = []byte(body)
	_ = m.RespondMsg(p)
}

func TestNoHandlerIsDelayedUntilOneAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: Policy{NoHandlerDelay: 200 * time.Millisecond}}, nil)
	b.publish(t, wire.TaskSubject("", "resize"), `{"id":"nh-1"}`)

	// No handler: a delayed retry that says so, not an attempt.
	evs := b.waitEvents(t, "nh-1", wire.EventRetryScheduled, 2, 10*time.Second)
	p := payload(t, evs[0])
	if p["reason"] != wire.ReasonNoHandler || p["class"] != "delay" || p["delay"] != "200ms" || p["attempt"] != float64(0) {
		t.Errorf("RETRY_SCHEDULED payload = %v, want reason no_handler, class delay, delay 200ms, attempt 0", p)
	}
	if !strings.Contains(evs[0].Message, "no handler answered on gantry.handlers.resize") {
		t.Errorf("RETRY_SCHEDULED message = %q, want it to say no handler answered on gantry.handlers.resize", evs[0].Message)
	}
	rec := b.waitState(t, "nh-1", wire.TaskRetryWait, 5*time.Second)
	if rec.Attempts != 0 {
		t.Errorf("attempts while no handler answers = %d, want 0", rec.Attempts)
	}

	// A handler comes: the task runs, on its first attempt.
	serve(t, b.env.NC, "resize", func(m *nats.Msg) { _ = m.Respond([]byte("resized")) })
	rec = b.waitState(t, "nh-1", wire.TaskSucceeded, 10*time.Second)
	if rec.Attempts != 1 || rec.Delays < 2 || rec.Output != "resized" {
		t.Errorf("record = attempts %d, delays %d, output %q, want 1, at least 2, resized", rec.Attempts, rec.Delays, rec.Output)
	}
}

func TestSilentHandlerIsNoticedWithinTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	var mu sync.Mutex
	var windows []string
	serve(t, b.env.NC, "render", func(m *nats.Msg) {
		mu.Lock()
		windows = append(windows, m.Header.Get(wire.HeaderHeartbeatWindow))
		mu.Unlock()
		if calls.Add(1) == 1 {
			// Beats twice, then dies without a word.
			progress(m, "frame 1")
			progress(m, "frame 2\n")
			return
		}
		progress(m, "")
		_ = m.Respond([]byte("rendered"))
	})
	b.start(t, Config{HeartbeatWindow: 300 * time.Millisecond, Policy: Policy{BackoffBase: 50 * time.Millisecond, Timeout: time.Minute}}, nil)
	lines := b.watchOutput(t, "silent-1")
	start := time.Now()
	b.publish(t, wire.TaskSubject("", "render"), `{"id":"silent-1"}`)
	rec := b.waitState(t, "silent-1", wire.TaskSucceeded, 10*time.Second)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("task took %v, want the silent handler noticed within its 300ms window, not the 1m timeout", took)
	}
	if rec.Attempts != 2 || rec.Output != "rendered" {
		t.Errorf("record = attempts %d, output %q, want 2 and rendered", rec.Attempts, rec.Output)
	}
	evs := b.waitEvents(t, "silent-1", wire.EventRetryScheduled, 1, 5*time.Second)
	if p := payload(t, evs[0]); p["reason"] != wire.ReasonHandlerSilent || p["attempt"] != float64(1) {
		t.Errorf("RETRY_SCHEDULED payload = %v, want reason handler_silent, attempt 1", p)
	}
	if !strings.Contains(evs[0].Message, "stopped sending heartbeats for 300ms") {
		t.Errorf("RETRY_SCHEDULED message = %q, want it to say the handler stopped sending heartbeats", evs[0].Message)
	}
	mu.Lock()
	if len(windows) == 0 || windows[0] != "300ms" {
		t.Errorf("%s headers = %v, want 300ms", wire.HeaderHeartbeatWindow, windows)
	}
	mu.Unlock()
	// The progress bodies are the task's live output.
	got := lines.wait(t, 2)
	if got[0].Line != "frame 1" || got[1].Line != "frame 2" || got[0].Stream != wire.OutputHandler || got[0].Attempt != 1 {
		t.Errorf("live lines = %+v, want frame 1 and frame 2 of stream handler, attempt 1", got)
	}
}

func TestHandlerWithoutHeartbeatsIsWaitedFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	serve(t, b.env.NC, "slow", func(m *nats.Msg) {
		go func() {
			time.Sleep(time.Second) // a handler that must be slower than the heartbeat window
			_ = m.Respond([]byte("done"))
		}()
	})
	b.start(t, Config{HeartbeatWindow: 200 * time.Millisecond}, nil)
	b.publish(t, wire.TaskSubject("", "slow"), `{"id":"slow-1"}`)
	rec := b.waitState(t, "slow-1", wire.TaskSucceeded, 10*time.Second)
	if rec.Attempts != 1 || rec.Output != "done" {
		t.Errorf("record = attempts %d, output %q, want 1 and done (no window before the first heartbeat)", rec.Attempts, rec.Output)
	}
}

func TestRejectedTaskKeepsItsID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{}, nil)
	b.publish(t, wire.TaskSubject("", "exec"), `{"id":"py-bad-r1","timeout":5}`)
	rec := b.waitState(t, "py-bad-r1", wire.TaskNeedsReview, 10*time.Second)
	if !strings.Contains(rec.LastError, "timeout") || rec.Kept == "" {
		t.Errorf("record = last error %q, kept %q, want the bad timeout named and the message kept", rec.LastError, rec.Kept)
	}
	evs := b.waitEvents(t, "py-bad-r1", wire.EventTaskRejected, 1, 5*time.Second)
	if !strings.Contains(evs[0].Message, `field "timeout"`) {
		t.Errorf("TASK_REJECTED message = %q, want it to name the timeout field", evs[0].Message)
	}
	// Without a usable id in the body, the Nats-Msg-Id names it.
	b.publish(t, wire.TaskSubject("", "exec"), `{"id":7,"timeout":"-1s"}`, "Nats-Msg-Id", "py-bad-r2")
	b.waitState(t, "py-bad-r2", wire.TaskNeedsReview, 10*time.Second)
}

func TestLostAttemptRecordedOnRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := Config{Queues: []Queue{{Name: "default", AckWait: time.Second}}, Policy: fastPolicy, StateDelay: 50 * time.Millisecond}
	cfg1 := cfg
	cfg1.Name = "doomed"
	started := make(chan struct{}, 1)
	hang := HandlerFunc(func(ctx context.Context, t *Task) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	})
	_, nc1 := b.start(t, cfg1, map[string]Handler{"job": hang})
	b.publish(t, wire.TaskSubject("", "job"), `{"id":"lost-1"}`)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("task not started")
	}
	b.waitState(t, "lost-1", wire.TaskRunning, 5*time.Second)
	// The worker dies mid-task: its connection goes, with its heartbeats.
	nc1.Close()
	var runs atomic.Int32
	b.start(t, cfg, map[string]Handler{"job": counter(&runs, 0, nil)})
	rec := b.waitState(t, "lost-1", wire.TaskSucceeded, 20*time.Second)
	if rec.Attempts != 2 {
		t.Errorf("attempts = %d, want 2 (one lost)", rec.Attempts)
	}
	evs := b.waitEvents(t, "lost-1", wire.EventAttemptLost, 1, 5*time.Second)
	p := payload(t, evs[0])
	if p["attempt"] != float64(1) || p["lost"] != float64(1) || p["worker"] != "doomed" || p["state"] != string(wire.TaskRunning) {
		t.Errorf("ATTEMPT_LOST payload = %v, want attempt 1, lost 1, worker doomed, state RUNNING", p)
	}
	if n := len(b.eventsOf("lost-1", wire.EventAttemptLost)); n != 1 {
		t.Errorf("ATTEMPT_LOST events = %d, want 1", n)
	}
}

func TestJobOnEveryTaskEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs atomic.Int32
	b.start(t, Config{Policy: fastPolicy}, map[string]Handler{"flaky": counter(&runs, 1, errFlaky)})
	// As the scheduler publishes a fire.
	b.publish(t, wire.TaskSubject("", "flaky"), `{"id":"nightly-1"}`, wire.HeaderJob, "nightly")
	rec := b.waitState(t, "nightly-1", wire.TaskSucceeded, 10*time.Second)
	if rec.Job != "nightly" {
		t.Errorf("record job = %q, want nightly", rec.Job)
	}
	b.waitEvents(t, "nightly-1", wire.EventTaskFinished, 1, 5*time.Second)
	for _, typ := range []wire.EventType{wire.EventTaskCreated, wire.EventTaskStarted, wire.EventRetryScheduled, wire.EventTaskFinished} {
		for _, ev := range b.waitEvents(t, "nightly-1", typ, 1, 5*time.Second) {
			if ev.JobID != "nightly" {
				t.Errorf("%s job_id = %q, want nightly", typ, ev.JobID)
			}
		}
	}
	// A job's task that ends in review carries it too.
	b.publish(t, wire.TaskSubject("", "noop"), `{"id":"nightly-2","payload":{"sleep":"x"}}`, wire.HeaderJob, "nightly")
	b.waitState(t, "nightly-2", wire.TaskNeedsReview, 10*time.Second)
	for _, typ := range []wire.EventType{wire.EventNeedsReview, wire.EventTaskFinished} {
		if ev := b.waitEvents(t, "nightly-2", typ, 1, 5*time.Second)[0]; ev.JobID != "nightly" {
			t.Errorf("%s job_id = %q, want nightly", typ, ev.JobID)
		}
	}
}

// lines collects the live output lines of one task.
type lines struct {
	mu  sync.Mutex
	got []wire.OutputLine
}

// watchOutput collects the live output of task id from now on.
func (b *bundle) watchOutput(t *testing.T, id string) *lines {
	t.Helper()
	l := &lines{}
	sub, err := b.env.NC.Subscribe(wire.OutputSubject(id), func(m *nats.Msg) {
		var ol wire.OutputLine
		if err := json.Unmarshal(m.Data, &ol); err != nil {
			t.Errorf("output line %q: %v", m.Data, err)
			return
		}
		l.mu.Lock()
		l.got = append(l.got, ol)
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *lines) snapshot() []wire.OutputLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wire.OutputLine{}, l.got...)
}

// wait waits for at least n lines.
func (l *lines) wait(t *testing.T, n int) []wire.OutputLine {
	t.Helper()
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := len(l.snapshot()); got < n {
			return fmt.Errorf("output lines = %d, want at least %d", got, n)
		}
		return nil
	})
	return l.snapshot()
}
