package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/jobs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// t0 is the fake clock's start in every broker test: a whole hour.
var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// bundle is one test's broker, fake clock and stores.
type bundle struct {
	t     *testing.T
	env   *brokertest.Env
	clk   *clock.Fake
	jobs  *jobs.Store
	st    *jobs.SchedulerStore
	tasks jetstream.Stream
	audit jetstream.Stream
}

// putState stores a job's state and waits for the bucket to have it.
func (b *bundle) putState(st wire.JobState) {
	b.t.Helper()
	m, err := b.st.StateMsg(st)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.env.JS.PublishMsg(context.Background(), m); err != nil {
		b.t.Fatal(err)
	}
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := brokertest.Start(t)
	ctx := context.Background()
	jobStore, err := jobs.NewStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	st, err := jobs.NewSchedulerStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := env.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	au, err := env.JS.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, env: env, clk: clock.NewFake(t0), jobs: jobStore, st: st, tasks: tasks, audit: au}
}

// start runs a scheduler on its own connection and waits until it leads
// (or, with lead false, until it is ready).
func (b *bundle) start(cfg Config, lead bool) (*Scheduler, func()) {
	b.t.Helper()
	s, stop, _ := b.startConn(cfg, lead)
	return s, stop
}

// startConn is start, also returning the scheduler's connection.
func (b *bundle) startConn(cfg Config, lead bool) (*Scheduler, func(), *nats.Conn) {
	b.t.Helper()
	nc, js := brokertest.Connect(b.t, b.env.URL)
	cfg.Clock = b.clk
	cfg.LeaderTTL = max(cfg.LeaderTTL, time.Second)
	cfg.Logger = b.env.Log
	s, err := New(cfg, js)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = s.Run(ctx); close(done) }()
	stop := func() {
		s.Stop()
		select {
		case <-done:
			if runErr != nil {
				b.t.Errorf("Run = %v, want nil", runErr)
			}
		case <-time.After(10 * time.Second):
			b.t.Error("Run did not return within 10s of Stop")
		}
		cancel()
	}
	b.t.Cleanup(func() {
		s.Stop()
		cancel()
		<-done
	})
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		b.t.Fatal("scheduler not ready within 10s")
	}
	if lead {
		b.waitLeading(s, cfg.ID)
	}
	return s, stop, nc
}

// waitLeading waits until scheduler s, named id, leads.
func (b *bundle) waitLeading(s *Scheduler, id string) {
	b.t.Helper()
	check.For(b.t, 15*time.Second, 10*time.Millisecond, func() error {
		if l, _ := s.Leading(); !l {
			return fmt.Errorf("scheduler %q Leading = false, want true", id)
		}
		return nil
	})
}

// addJob stores a job, created at the fake clock's time.
func (b *bundle) addJob(j wire.Job) wire.Job {
	b.t.Helper()
	j, err := jobs.Normalize(j)
	if err != nil {
		b.t.Fatal(err)
	}
	j.CreatedAt, j.UpdatedAt = b.clk.Now(), b.clk.Now()
	if _, err := b.jobs.Create(context.Background(), j); err != nil {
		b.t.Fatal(err)
	}
	return j
}

func (b *bundle) modify(name string, fn func(*wire.Job)) {
	b.t.Helper()
	if _, err := b.jobs.Modify(context.Background(), name, func(j *wire.Job) error {
		fn(j)
		j.UpdatedAt = b.clk.Now()
		return nil
	}); err != nil {
		b.t.Fatal(err)
	}
}

// taskMsg is a task message read back from the tasks stream.
type taskMsg struct {
	subject string
	id      string
	msgID   string
	job     string
	planned time.Time
	task    wire.Task
}

// taskMsgs reads every task message in the stream, without consuming it.
func (b *bundle) taskMsgs() []taskMsg {
	b.t.Helper()
	ctx := context.Background()
	info, err := b.tasks.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []taskMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := b.tasks.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			b.t.Fatal(err)
		}
		tm := taskMsg{subject: m.Subject, msgID: m.Header.Get(jetstream.MsgIDHeader), job: m.Header.Get(wire.HeaderJob)}
		tm.planned, _ = time.Parse(time.RFC3339Nano, m.Header.Get(wire.HeaderPlanned))
		if err := json.Unmarshal(m.Data, &tm.task); err != nil {
			b.t.Fatal(err)
		}
		tm.id = tm.task.ID
		out = append(out, tm)
	}
	return out
}

// waitTasks waits until the stream holds n task messages and returns them.
func (b *bundle) waitTasks(n int) []taskMsg {
	b.t.Helper()
	var got []taskMsg
	check.For(b.t, 15*time.Second, 10*time.Millisecond, func() error {
		if got = b.taskMsgs(); len(got) < n {
			return fmt.Errorf("tasks = %d %v, want %d", len(got), ids(got), n)
		}
		return nil
	})
	if len(got) != n {
		b.t.Fatalf("tasks = %d, want %d: %v", len(got), n, ids(got))
	}
	return got
}

func ids(ms []taskMsg) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.id
	}
	sort.Strings(out)
	return out
}

// events reads every audit event of type typ.
func (b *bundle) events(typ wire.EventType) []wire.Event {
	b.t.Helper()
	ctx := context.Background()
	info, err := b.audit.Info(ctx, jetstream.WithSubjectFilter(typ.Subject()))
	if err != nil {
		b.t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	var out []wire.Event
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := b.audit.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			b.t.Fatal(err)
		}
		if m.Subject != typ.Subject() {
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			b.t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// waitEvents waits until at least n events of typ exist and returns them.
func (b *bundle) waitEvents(typ wire.EventType, n int) []wire.Event {
	b.t.Helper()
	var got []wire.Event
	check.For(b.t, 15*time.Second, 10*time.Millisecond, func() error {
		if got = b.events(typ); len(got) < n {
			return fmt.Errorf("%s events = %d, want at least %d", typ, len(got), n)
		}
		return nil
	})
	return got
}

// finishTask emits the TASK_FINISHED event a worker would.
func (b *bundle) finishTask(id string, state wire.TaskState) {
	b.t.Helper()
	em := audit.NewEmitter(b.env.JS, "workers", nil)
	if err := em.Emit(context.Background(), wire.Event{Type: wire.EventTaskFinished, TaskID: id, Host: "worker-host",
		Payload: audit.Payload(map[string]any{"state": state, "attempts": 1})}); err != nil {
		b.t.Fatal(err)
	}
}

// advance moves the fake clock by d once the scheduler has a timer armed.
func (b *bundle) advance(d time.Duration) {
	b.t.Helper()
	check.For(b.t, 15*time.Second, 10*time.Millisecond, func() error {
		if b.clk.Timers() == 0 {
			return errors.New("fake clock Timers = 0, want an armed timer")
		}
		return nil
	})
	b.clk.Advance(d)
}

func payloadField(ev wire.Event, key string) any {
	var m map[string]any
	_ = json.Unmarshal(ev.Payload, &m)
	return m[key]
}
