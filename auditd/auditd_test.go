package auditd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/lifecycle/lifecycletest"
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/kv"
)

// startService runs a sink on env until the test ends and waits until it is
// ready.
func startService(t *testing.T, env *brokertest.Env, cfg Config) *Service {
	t.Helper()
	cfg.Logger = env.Log.With("component", "auditd")
	s, err := New(cfg, env.NC)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	t.Cleanup(func() {
		s.Stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil after Stop", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of Stop")
		}
	})
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
	return s
}

// publish publishes raw events (no emitter) on their subjects.
func publish(t *testing.T, js jetstream.JetStream, evs []wire.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(ev.Type.Subject(), data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publish did not complete")
	}
}

// eventually polls cond until it holds or 20 s pass.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	check.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if ok, state := cond(); !ok {
			return fmt.Errorf("%s: still %s", what, state)
		}
		return nil
	})
}

// serviceQueryAll pages through the NATS service.
func serviceQueryAll(t *testing.T, nc *nats.Conn, q wire.AuditQuery) []wire.Event {
	t.Helper()
	all, err := tryServiceQueryAll(nc, q)
	if err != nil {
		t.Fatalf("Query(%+v): %v", q, err)
	}
	return all
}

func tryServiceQueryAll(nc *nats.Conn, q wire.AuditQuery) ([]wire.Event, error) {
	var all []wire.Event
	for range 1000 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var page wire.AuditPage
		err := rpc.Request(ctx, nc, wire.SubjectAuditQuery, q, &page)
		cancel()
		if err != nil {
			return nil, err
		}
		all = append(all, page.Events...)
		if page.Cursor == "" {
			return all, nil
		}
		q.Cursor = page.Cursor
	}
	return nil, errors.New("cursor never ended")
}

// waitStored waits until the service answers with n events; a failed store
// answering 503 in between counts as not yet.
func waitStored(t *testing.T, nc *nats.Conn, n int) {
	t.Helper()
	eventually(t, "events stored", func() (bool, string) {
		all, err := tryServiceQueryAll(nc, wire.AuditQuery{Limit: MaxLimit})
		if err != nil {
			return false, err.Error()
		}
		return len(all) == n, fmt.Sprintf("%d stored, want %d", len(all), n)
	})
}

func TestServiceIngestsAndAnswersQueries(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	startService(t, env, Config{Dir: filepath.Join(t.TempDir(), "audit")})

	em := audit.NewEmitter(env.JS, "workers", nil)
	ctx := context.Background()
	for i := range 40 {
		ev := wire.Event{Type: wire.EventTaskStarted, TaskID: fmt.Sprintf("task-%d", i%4), ResourceID: "cam1",
			Payload: audit.Payload(map[string]any{"attempt": i, "Env": map[string]any{"API_TOKEN": "s3cret"}})}
		if i%10 == 9 {
			ev.Type, ev.Level = wire.EventTaskFinished, wire.LevelWarn
		}
		if err := em.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	waitStored(t, env.NC, 40)

	// Several machines: a second host's events land in the same store.
	other := testEvents(5)
	for i := range other {
		other[i].Host = "pc-2"
		other[i].TaskID = "remote-" + other[i].TaskID
		other[i].Time = time.Now().Add(time.Duration(i) * time.Millisecond)
	}
	publish(t, env.JS, other)
	waitStored(t, env.NC, 45)

	got := serviceQueryAll(t, env.NC, wire.AuditQuery{TaskID: "task-1", Limit: 3})
	if len(got) != 10 {
		t.Errorf("task-1 has %d events through the service, want 10", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].Time.Before(got[i-1].Time) {
			t.Errorf("events out of order: %s before %s", got[i-1].Time, got[i].Time)
		}
	}
	if fin := serviceQueryAll(t, env.NC, wire.AuditQuery{Type: wire.EventTaskFinished, Level: wire.LevelWarn}); len(fin) != 4 {
		t.Errorf("TASK_FINISHED warn events = %d, want 4", len(fin))
	}
	var p struct{ Env map[string]string }
	if err := json.Unmarshal(got[0].Payload, &p); err != nil || p.Env["API_TOKEN"] != wire.Redacted {
		t.Errorf("payload Env = %v (%v), want API_TOKEN redacted", p.Env, err)
	}

	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := rpc.Request(ctx, env.NC, wire.SubjectAuditQuery, wire.AuditQuery{Limit: MaxLimit + 1}, &wire.AuditPage{})
	var se *rpc.Error
	if !errors.As(err, &se) || se.Code != rpc.CodeInvalid || !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Query with a bad limit = %v, want a 400 matching kv.ErrInvalid", err)
	}
	if err := rpc.Request(ctx, env.NC, wire.SubjectAuditQuery, "not a query", nil); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Query with a bad body = %v, want a 400 matching kv.ErrInvalid", err)
	}
	// The counter moves just after the commit the queries already see.
	eventually(t, "stats through the service", func() (bool, string) {
		var stats wire.AuditStats
		if err := rpc.Request(ctx, env.NC, wire.SubjectAuditStats, nil, &stats); err != nil {
			return false, err.Error()
		}
		return stats.Stored == 45 && stats.Retention == DefaultRetention.String(),
			fmt.Sprintf("%+v, want 45 stored and the default retention", stats)
	})
}

func TestServiceIsDiscoverable(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	startService(t, env, Config{Dir: filepath.Join(t.TempDir(), "audit")})
	// `nats micro ls` sends a PING to $SRV.PING and lists the answers.
	msg, err := env.NC.Request("$SRV.INFO."+wire.AuditServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("service info: %v", err)
	}
	var info struct {
		Name      string `json:"name"`
		Endpoints []struct {
			Subject string `json:"subject"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, e := range info.Endpoints {
		subjects = append(subjects, e.Subject)
	}
	slices.Sort(subjects)
	want := []string{wire.SubjectAuditBackup, wire.SubjectAuditQuery, wire.SubjectAuditStats}
	if info.Name != wire.AuditServiceName || !slices.Equal(subjects, want) {
		t.Errorf("service %q endpoints %v, want %q with %v", info.Name, subjects, wire.AuditServiceName, want)
	}
}

func TestServiceEventsSurviveRestart(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := filepath.Join(t.TempDir(), "audit")
	evs := testEvents(100)

	s, err := New(Config{Dir: dir, Logger: env.Log}, env.NC)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	<-s.Ready()
	publish(t, env.JS, evs[:60])
	waitStored(t, env.NC, 60)
	s.Stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}

	// Published while no sink runs: the durable consumer keeps them.
	publish(t, env.JS, evs[60:])
	startService(t, env, Config{Dir: dir})
	waitStored(t, env.NC, 100)
	if got := ids(serviceQueryAll(t, env.NC, wire.AuditQuery{Limit: 17})); !slices.Equal(got, ids(evs)) {
		t.Errorf("after restart got %d events, want the %d in order", len(got), len(evs))
	}
}

func TestServiceRedeliveryDoesNotDuplicate(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := filepath.Join(t.TempDir(), "audit")
	evs := testEvents(50)
	publish(t, env.JS, evs)
	// The same events again (a producer retrying without Nats-Msg-Id).
	publish(t, env.JS, evs[:20])
	s := startService(t, env, Config{Dir: dir})
	eventually(t, "stream consumed", func() (bool, string) {
		st := s.Stats()
		return st.Stored == 70, fmt.Sprintf("%+v", st)
	})
	if got := serviceQueryAll(t, env.NC, wire.AuditQuery{Limit: MaxLimit}); len(got) != 50 {
		t.Errorf("after 70 deliveries of 50 events the store holds %d, want 50", len(got))
	}
	if got := serviceQueryAll(t, env.NC, wire.AuditQuery{TaskID: "task-3"}); len(got) != len(want(evs, func(e *wire.Event) bool { return e.TaskID == "task-3" })) {
		t.Errorf("task index holds %d events, want no duplicates", len(got))
	}
	// Every message delivered again from the start: still nothing new.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := env.JS.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(70)
	if err != nil {
		t.Fatal(err)
	}
	var again []wire.Event
	for m := range batch.Messages() {
		var ev wire.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		again = append(again, ev)
	}
	if _, err := s.store.Write(again); err != nil {
		t.Fatalf("rewriting all %d delivered events: %v", len(again), err)
	}
	if got := serviceQueryAll(t, env.NC, wire.AuditQuery{Limit: MaxLimit}); len(got) != 50 {
		t.Errorf("stored %d events, want 50", len(got))
	}
}

func TestServiceSkipsMalformedEvents(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	s := startService(t, env, Config{Dir: filepath.Join(t.TempDir(), "audit")})
	evs := testEvents(10)
	publish(t, env.JS, evs[:5])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, body := range []string{`not json`, `{"id":"x"}`, `{"id":"","type":"TASK_CREATED","time":"2026-11-30T00:00:00Z"}`} {
		if _, err := env.JS.Publish(ctx, "gantry.audit.task.created", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, env.JS, evs[5:])
	eventually(t, "all messages handled", func() (bool, string) {
		st := s.Stats()
		return st.Stored == 13 && st.Malformed == 3, fmt.Sprintf("%+v", st)
	})
	if got := serviceQueryAll(t, env.NC, wire.AuditQuery{Type: wire.EventAuditMalformed}); len(got) != 3 {
		t.Errorf("AUDIT_MALFORMED records = %d, want 3", len(got))
	} else if !json.Valid(got[0].Payload) || got[0].Level != wire.LevelWarn {
		t.Errorf("malformed record = %+v, want a warn with a payload", got[0])
	}
	if got := ids(serviceQueryAll(t, env.NC, wire.AuditQuery{Type: wire.EventTaskCreated})); len(got) != len(want(evs, func(e *wire.Event) bool { return e.Type == wire.EventTaskCreated })) {
		t.Errorf("valid TASK_CREATED events after the malformed ones = %d", len(got))
	}
	eventually(t, "everything acknowledged", func() (bool, string) {
		info, err := env.JS.Consumer(context.Background(), wire.StreamAudit, DefaultConsumer)
		if err != nil {
			return false, err.Error()
		}
		ci, err := info.Info(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return ci.NumAckPending == 0 && ci.NumPending == 0, fmt.Sprintf("ack pending %d, pending %d", ci.NumAckPending, ci.NumPending)
	})
}

func TestServiceWriteErrorLosesNothing(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	toggle := &errorfs.Toggle{Injector: errorfs.ErrInjected.If(errorfs.Writes)}
	s := startService(t, env, Config{
		Dir: filepath.Join(t.TempDir(), "audit"), FS: errorfs.Wrap(vfs.Default, toggle),
		RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond,
	})
	evs := testEvents(300)
	publish(t, env.JS, evs[:100])
	waitStored(t, env.NC, 100)

	toggle.On()
	publish(t, env.JS, evs[100:200])
	eventually(t, "write errors", func() (bool, string) {
		st := s.Stats()
		return st.WriteErrors >= 3, fmt.Sprintf("%+v", st)
	})
	// auditd says it is not ready (its /readyz), naming the store.
	eventually(t, "unready", func() (bool, string) {
		err := s.Healthy()
		return errors.Is(err, ErrUnavailable), fmt.Sprint(err)
	})
	failedAt := time.Now()
	ci := consumerInfo(t, env.JS)
	if ci.NumAckPending == 0 {
		t.Errorf("ack pending = 0 while the disk fails, want the unwritten events unacknowledged")
	}
	if ci.AckFloor.Stream > 100 {
		t.Errorf("ack floor = %d while the disk fails, want at most 100 (only what was written)", ci.AckFloor.Stream)
	}
	publish(t, env.JS, evs[200:])

	toggle.Off()
	recovering := time.Now()
	waitStored(t, env.NC, 300)
	if err := s.Healthy(); err != nil {
		t.Errorf("Healthy once the writes succeed again = %v, want nil", err)
	}
	t.Logf("write errors for %v, %d counted; all 300 events stored %v after the writes succeeded again",
		recovering.Sub(failedAt).Round(time.Millisecond), s.Stats().WriteErrors, time.Since(recovering).Round(time.Millisecond))
	if got := ids(serviceQueryAll(t, env.NC, wire.AuditQuery{Limit: 1000})); !slices.Equal(got, ids(evs)) {
		t.Errorf("after the disk recovered got %d events, want all %d in order", len(got), len(evs))
	}
	eventually(t, "everything acknowledged", func() (bool, string) {
		ci := consumerInfo(t, env.JS)
		return ci.NumAckPending == 0 && ci.NumPending == 0, fmt.Sprintf("ack pending %d, pending %d", ci.NumAckPending, ci.NumPending)
	})
}

func consumerInfo(t *testing.T, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, wire.StreamAudit, DefaultConsumer)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

func TestServiceRetention(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	now := time.Now().UTC()
	// The fake clock starts two days back, so that the run at start, which
	// may come while the events arrive, removes none of them.
	clk := clock.NewFake(now.Add(-48 * time.Hour))
	s := startService(t, env, Config{
		Dir: filepath.Join(t.TempDir(), "audit"), Retention: 24 * time.Hour,
		RetentionInterval: time.Hour, Clock: clk,
	})
	evs := testEvents(60)
	for i := range evs {
		// From 50 h ago to 1 h ago.
		evs[i].Time = now.Add(-50*time.Hour + time.Duration(i)*49*time.Minute)
	}
	publish(t, env.JS, evs)
	waitStored(t, env.NC, 60)

	// Once the events are in, the clock moves to an hour from now and the
	// timer runs retention.
	eventually(t, "retention timer armed", func() (bool, string) { return clk.Timers() > 0, "no timer" })
	clk.Set(now.Add(time.Hour))
	cutoff := now.Add(time.Hour - 24*time.Hour)
	kept := want(evs, func(e *wire.Event) bool { return !e.Time.Before(cutoff) })
	eventually(t, "old events removed", func() (bool, string) {
		got := len(serviceQueryAll(t, env.NC, wire.AuditQuery{Limit: MaxLimit}))
		return got == len(kept), fmt.Sprintf("%d stored, want %d", got, len(kept))
	})
	if got := ids(serviceQueryAll(t, env.NC, wire.AuditQuery{Limit: MaxLimit})); !slices.Equal(got, kept) {
		t.Errorf("after retention got %v, want %v", got, kept)
	}
	eventually(t, "expired counted", func() (bool, string) {
		st := s.Stats()
		return st.Expired == uint64(len(evs)-len(kept)), fmt.Sprintf("expired %d, want %d", st.Expired, len(evs)-len(kept))
	})
}

func TestServiceBackup(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	data := t.TempDir()
	// What a backup interrupted by a crash leaves behind.
	stale := filepath.Join(data, scratchPattern+"123", "store")
	if err := os.MkdirAll(stale, 0o750); err != nil {
		t.Fatal(err)
	}
	startService(t, env, Config{Dir: filepath.Join(data, "audit")})
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale scratch dir after start: %v, want it removed", err)
	}
	evs := testEvents(250)
	publish(t, env.JS, evs)
	waitStored(t, env.NC, 250)

	dir := filepath.Join(t.TempDir(), "backup")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(env.NC)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.BackupAudit(ctx, dir)
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}
	if len(reply.Files) == 0 {
		t.Fatal("backup has no files")
	}
	if _, err := c.BackupAudit(ctx, dir); err == nil {
		t.Error("Backup into a non-empty dir = nil, want an error")
	}
	if err := rpc.Request(ctx, env.NC, wire.SubjectAuditBackup, wire.AuditBackupRequest{Name: "../x"}, nil); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Backup named ../x = %v, want a 400 matching kv.ErrInvalid", err)
	}
	b := openTestStore(t, dir)
	for _, q := range []wire.AuditQuery{{Limit: 1000}, {TaskID: "task-3"}, {ResourceID: "cam1", Level: wire.LevelWarn}} {
		got := ids(queryAll(t, b, q))
		w := ids(serviceQueryAll(t, env.NC, q))
		if len(got) == 0 || !slices.Equal(got, w) {
			t.Errorf("backup answers %+v with %d events, want the live store's %d", q, len(got), len(w))
		}
	}
	// The hand-over objects are gone.
	obs, err := env.JS.ObjectStore(ctx, wire.BucketAuditBackups)
	if err != nil {
		t.Fatal(err)
	}
	if list, err := obs.List(ctx); !errors.Is(err, jetstream.ErrNoObjectsFound) {
		t.Errorf("backup bucket after fetch holds %d objects (%v), want none", len(list), err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	for name, cfg := range map[string]Config{
		"no dir":             {},
		"negative retention": {Dir: "x", Retention: -time.Hour},
		"short ack wait":     {Dir: "x", AckWait: time.Millisecond},
	} {
		if _, err := New(cfg, env.NC); err == nil {
			t.Errorf("%s: New = nil error, want one", name)
		}
	}
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "audit"), Retention: KeepForever}, env.NC)
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Stop()
	if st := s.Stats(); st.Retention != "0s" {
		t.Errorf("retention = %s, want 0s for KeepForever", st.Retention)
	}
	if err := s.Run(context.Background()); err != nil {
		t.Errorf("Run after Stop = %v, want nil", err)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	t.Run("misuse", func(t *testing.T) {
		lifecycletest.Misuse(t, func(t testing.TB) lifecycletest.Actor {
			s, err := New(Config{Dir: filepath.Join(t.TempDir(), "audit"), Logger: env.Log}, env.NC)
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
	t.Run("failed start", func(t *testing.T) {
		// The store's directory is a file: the store cannot open.
		dir := filepath.Join(t.TempDir(), "audit")
		if err := os.WriteFile(dir, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Dir: dir, Logger: env.Log}, env.NC)
		if err != nil {
			t.Fatal(err)
		}
		lifecycletest.FailedStart(t, s)
	})
}

func TestStopWhileWaitingForTheStream(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := env.JS.DeleteStream(ctx, wire.StreamAudit); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "audit"), Logger: env.Log}, env.NC)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
		t.Fatal("ready without the audit stream")
	case <-time.After(200 * time.Millisecond):
	}
	s.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after Stop = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of Stop")
	}
}

// TestServicePagesBySize: a page stops before its reply would pass the
// broker's message limit, with a cursor: 5000 small events asked in one
// page, and two 600 KB events of one task (any client may publish them), all
// come back; none is dropped for being too large.
func TestServicePagesBySize(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	startService(t, env, Config{Dir: t.TempDir()})
	evs := make([]wire.Event, 5000)
	for i := range evs {
		evs[i] = wire.Event{ID: fmt.Sprintf("ev-%05d", i), Time: t0.Add(time.Duration(i) * time.Millisecond),
			Type: wire.EventTaskFinished, Level: wire.LevelInfo, Component: "test", Host: "pc-1", TaskID: fmt.Sprintf("small-%d", i),
			Message: strings.Repeat("m", 300)}
	}
	big := strings.Repeat("b", 600<<10)
	for i := range 2 {
		evs = append(evs, wire.Event{ID: fmt.Sprintf("big-%d", i), Time: t0.Add(time.Hour + time.Duration(i)*time.Second),
			Type: wire.EventTaskFinished, Level: wire.LevelInfo, Component: "test", Host: "pc-1", TaskID: "big-task",
			Payload: json.RawMessage(`{"blob":"` + big + `"}`)})
	}
	publish(t, env.JS, evs)
	waitStored(t, env.NC, len(evs))

	for _, q := range []wire.AuditQuery{{Limit: 5000}, {TaskID: "big-task"}} {
		// The rest of the 5000 is asked for page by page, as the CLI does.
		var all []wire.Event
		pages, limit := 0, q.Limit
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var page wire.AuditPage
			err := rpc.Request(ctx, env.NC, wire.SubjectAuditQuery, q, &page)
			cancel()
			if err != nil {
				t.Fatalf("query %+v, page %d: %v", q, pages+1, err)
			}
			pages++
			all = append(all, page.Events...)
			if page.Cursor == "" || limit > 0 && len(all) >= limit {
				break
			}
			q.Cursor = page.Cursor
			if limit > 0 {
				q.Limit = limit - len(all)
			}
		}
		want := 5000
		if q.TaskID != "" {
			want = 2
		}
		if len(all) != want || pages < 2 {
			t.Errorf("query %+v = %d events in %d pages, want %d in more than one page", q, len(all), pages, want)
		}
		if q.TaskID != "" && (string(all[0].Payload) != `{"blob":"`+big+`"}` || all[1].ID != "big-1") {
			t.Errorf("big events = %s (%d bytes), %s; want both whole", all[0].ID, len(all[0].Payload), all[1].ID)
		}
	}
}

// TestServiceRecreatesItsConsumer: auditd's consumer, then the audit
// stream, deleted behind its back, are recreated, and events published
// after are stored; Healthy says so meanwhile.
func TestServiceRecreatesItsConsumer(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	s := startService(t, env, Config{Dir: t.TempDir(), ConsumerCheck: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs := testEvents(2)
	for i, remove := range []func() error{
		func() error { return env.JS.DeleteConsumer(ctx, wire.StreamAudit, DefaultConsumer) },
		func() error { return env.JS.DeleteStream(ctx, wire.StreamAudit) },
	} {
		if err := remove(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "consuming again", func() (bool, string) {
			if err := s.Healthy(); err != nil {
				return false, err.Error()
			}
			if _, err := env.JS.Stream(ctx, wire.StreamAudit); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		publish(t, env.JS, evs[i:i+1])
		waitStored(t, env.NC, i+1)
	}
}

// countingHandler counts the ERROR records with message msg and passes
// every record on.
type countingHandler struct {
	slog.Handler
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelError && r.Message == h.msg {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.msg, h.n}
}

func (h countingHandler) WithGroup(g string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(g), h.msg, h.n}
}

// TestServiceOnAFullDisk: auditd's disk is full. Writes wait (nothing is
// acknowledged), queries answer at once, /readyz would say why (Healthy),
// Pebble is never left retrying and logging ninety errors a second, a Stop
// returns at once, and once space is freed every event is stored.
func TestServiceOnAFullDisk(t *testing.T) {
	t.Parallel()
	small := brokertest.SmallDisk(t, "96m")
	env := brokertest.Start(t)
	var pebbleErrors atomic.Int64
	log := slog.New(countingHandler{env.Log.Handler(), "pebble", &pebbleErrors})
	s, err := New(Config{Dir: small + "/audit", MinFreeSpace: 2 << 20, RetryDelay: 20 * time.Millisecond,
		MaxRetryDelay: 200 * time.Millisecond, Logger: log}, env.NC)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	select {
	case <-s.Ready():
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
	free := brokertest.FillDisk(t, small)
	var evs []wire.Event
	for i := range 400 {
		evs = append(evs, wire.Event{ID: fmt.Sprintf("fill-%04d", i), Time: t0.Add(time.Duration(i) * time.Second),
			Type: wire.EventTaskFinished, Level: wire.LevelInfo, Component: "test", Host: "pc-1", Message: strings.Repeat("m", 8<<10)})
	}
	publish(t, env.JS, evs)
	eventually(t, "the store failed", func() (bool, string) {
		err := s.Healthy()
		return err != nil, fmt.Sprint(err)
	})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = rpc.Request(ctx, env.NC, wire.SubjectAuditQuery, wire.AuditQuery{}, nil)
	cancel()
	if (err != nil && !errors.Is(err, kv.ErrUnavailable)) || time.Since(start) > time.Second {
		t.Errorf("query on a full disk = %v after %v, want an answer (or a 503) at once", err, time.Since(start))
	}
	before := pebbleErrors.Load()
	time.Sleep(2 * time.Second) // a span to count log lines over, not a wait for something
	if n := pebbleErrors.Load() - before; n > 4 {
		t.Errorf("pebble errors logged in 2s on a full disk = %d, want at most a few", n)
	}

	free()
	waitStored(t, env.NC, len(evs))
	if err := s.Healthy(); err != nil {
		t.Errorf("Healthy once stored again = %v, want nil", err)
	}

	// Full again: Stop ends Run at once.
	free = brokertest.FillDisk(t, small)
	defer free()
	publish(t, env.JS, evs[:1])
	eventually(t, "the store failed again", func() (bool, string) {
		more := make([]wire.Event, 50)
		for i := range more {
			more[i] = evs[i]
			more[i].ID = fmt.Sprintf("again-%d-%d", time.Now().UnixNano(), i)
		}
		publish(t, env.JS, more)
		err := s.Healthy()
		return err != nil, fmt.Sprint(err)
	})
	start = time.Now()
	s.Stop()
	select {
	case err := <-done:
		done <- err
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Stop on a full disk took %v, want at once", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10s after Stop on a full disk")
	}
}
