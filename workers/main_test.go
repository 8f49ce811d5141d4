package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/internal/pgtest"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/tasks"
)

// pg is the PostgreSQL server of the sql task tests, started by the first
// that needs it.
var pg pgtest.Shared

func TestMain(m *testing.M) {
	// The test binary is the shim of the exec tasks' Subreaper trees.
	proctree.ShimMain()
	goleak.VerifyTestMain(m, leaktest.Options(goleak.Cleanup(func(code int) {
		pg.Stop()
		os.Exit(code)
	}))...)
}

// bundle is a broker, a client, and a way to watch tasks and events.
type bundle struct {
	env   *brokertest.Env
	tasks *tasks.Store

	mu     sync.Mutex
	events []wire.Event
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := brokertest.Start(t)
	ts, err := tasks.NewStore(context.Background(), env.JS, tasks.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{env: env, tasks: ts}
	sub, err := env.NC.Subscribe(wire.SubjectAuditAll, func(m *nats.Msg) {
		var ev wire.Event
		if json.Unmarshal(m.Data, &ev) == nil {
			b.mu.Lock()
			b.events = append(b.events, ev)
			b.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return b
}

// start runs workers with cfg on a connection of their own until the test
// ends.
func (b *bundle) start(t *testing.T, cfg Config, handlers map[string]Handler) (*Workers, *nats.Conn) {
	t.Helper()
	nc, _ := brokertest.Connect(t, b.env.URL)
	if cfg.Logger == nil {
		cfg.Logger = b.env.Log.With("component", "workers")
	}
	if cfg.ProcessTrees.Shim == "" {
		cfg.ProcessTrees.Shim = shim(t)
	}
	w, err := New(cfg, nc)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := w.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		w.Stop()
		time.AfterFunc(3*time.Second, cancel)
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		cancel()
	})
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before ready", err)
	case <-time.After(10 * time.Second):
		t.Fatal("workers not ready within 10s")
	}
	return w, nc
}

// shim is the test binary, the shim of Subreaper trees.
func shim(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// publish publishes a task body with plain core NATS, as `nats pub` does.
func (b *bundle) publish(t *testing.T, subject string, body any, hdr ...string) {
	t.Helper()
	m := nats.NewMsg(subject)
	switch v := body.(type) {
	case string:
		m.Data = []byte(v)
	case []byte:
		m.Data = v
	default:
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		m.Data = data
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	if _, err := b.env.JS.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// waitState polls the task's record until it is in state.
func (b *bundle) waitState(t *testing.T, id string, state wire.TaskState, within time.Duration) wire.TaskRecord {
	t.Helper()
	var rec wire.TaskRecord
	check.For(t, within, 20*time.Millisecond, func() error {
		r, _, err := b.tasks.Get(context.Background(), id)
		if rec = r; err != nil || r.State != state {
			return fmt.Errorf("task %s: state = %q (err %v, last_error %q), want %s", id, r.State, err, r.LastError, state)
		}
		return nil
	})
	return rec
}

// eventsOf returns the events of task id of type typ seen so far.
func (b *bundle) eventsOf(id string, typ wire.EventType) []wire.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []wire.Event
	for _, ev := range b.events {
		if ev.TaskID == id && ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// waitEvents waits for n events of task id of type typ.
func (b *bundle) waitEvents(t *testing.T, id string, typ wire.EventType, n int, within time.Duration) []wire.Event {
	t.Helper()
	var evs []wire.Event
	check.For(t, within, 20*time.Millisecond, func() error {
		if evs = b.eventsOf(id, typ); len(evs) < n {
			return fmt.Errorf("task %s: %d %s events, want %d", id, len(evs), typ, n)
		}
		return nil
	})
	return evs
}

// streamMsgs is how many task messages are left in their queues (the
// messages kept for review not counted).
func (b *bundle) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	s, err := b.env.JS.Stream(context.Background(), wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for subj, msgs := range info.State.Subjects {
		if !strings.HasPrefix(subj, wire.SubjectReviewPrefix+".") {
			n += msgs
		}
	}
	return n
}

// kept returns the message kept for the review of the task of rec.
func (b *bundle) kept(t *testing.T, rec wire.TaskRecord) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := b.env.JS.Stream(context.Background(), wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), rec.Kept)
	if err != nil {
		t.Fatalf("kept message of task %s on %q: %v", rec.ID, rec.Kept, err)
	}
	return m
}

// waitEmpty waits until no task message is left in its queue.
func (b *bundle) waitEmpty(t *testing.T, within time.Duration) {
	t.Helper()
	check.For(t, within, 20*time.Millisecond, func() error {
		if n := b.streamMsgs(t); n != 0 {
			return fmt.Errorf("stream messages = %d, want 0", n)
		}
		return nil
	})
}

// payload returns the decoded payload of ev.
func payload(t *testing.T, ev wire.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(ev.Payload, &m); err != nil {
		t.Fatalf("event payload %s: %v", ev.Payload, err)
	}
	return m
}

// fastPolicy retries quickly.
var fastPolicy = Policy{BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second, Delay: 100 * time.Millisecond, Timeout: 20 * time.Second}

var errFlaky = errors.New("flaky")

// cancelRequest is the body of a cancel request for task id.
func cancelRequest(t *testing.T, id string) []byte {
	t.Helper()
	data, err := json.Marshal(wire.TaskCancelRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// askCancel asks the workers to cancel task id, as 'gantry task cancel'
// does, and returns the answer of the one that records the task's end.
func askCancel(b *bundle, id string, wait time.Duration) (wire.TaskCancelReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var reply wire.TaskCancelReply
	err := rpc.Request(ctx, b.env.NC, wire.SubjectTaskCancel, wire.TaskCancelRequest{ID: id}, &reply)
	return reply, err
}
