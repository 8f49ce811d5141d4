package asyncpub

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// logs records the messages of the records logged through it.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logs) WithGroup(string) slog.Handler      { return l }

func (l *logs) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.msgs, msg)
}

// setup starts a broker with a stream on "stored.>", and a publisher whose
// acknowledgements time out after 300 ms.
func setup(t *testing.T, cfg Config) (*brokertest.Env, *Publisher, *logs) {
	t.Helper()
	env := brokertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "STORED", Subjects: []string{"stored.>"}}); err != nil {
		t.Fatal(err)
	}
	l := &logs{}
	cfg.Timeout = 300 * time.Millisecond
	cfg.Logger = slog.New(l)
	p, err := New(env.NC, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env, p, l
}

// unanswered subscribes to subject without answering: a publish on it is
// never acknowledged. The returned function unsubscribes.
func unanswered(t *testing.T, nc *nats.Conn, subject string) func() {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = sub.Unsubscribe()
		_ = nc.Flush()
	}
}

// addStream creates stream name on subject.
func addStream(t *testing.T, js jetstream.JetStream, name, subject string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func flush(t *testing.T, p *Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("Flush = %v, want nil", err)
	}
}

func TestPublishAndFlush(t *testing.T) {
	t.Parallel()
	env, p, _ := setup(t, Config{MaxPending: 4})
	for range 50 {
		p.Publish(&nats.Msg{Subject: "stored.x", Data: []byte("{}")}, "")
	}
	flush(t, p)
	if got := len(p.pending); got != 0 {
		t.Errorf("pending after Flush = %d, want 0", got)
	}
	s, err := env.JS.Stream(context.Background(), "STORED")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(context.Background()); err != nil || info.State.Msgs != 50 {
		t.Errorf("stored = %v, %v; want 50 messages", info, err)
	}
}

// TestRepublishUnderID publishes into a subject no stream stores yet, with
// a subscriber that never answers: the publish times out, and Flush
// publishes it again under its id, into the stream created meanwhile.
func TestRepublishUnderID(t *testing.T) {
	t.Parallel()
	// Patience keeps the republish trying until the stream exists, however
	// long creating it takes on a loaded machine.
	env, p, l := setup(t, Config{Patience: 30 * time.Second})
	stopSilent := unanswered(t, env.NC, "late.x")
	p.Publish(&nats.Msg{Subject: "late.x", Data: []byte(`{"id":"ev-1"}`)}, "ev-1")
	stopSilent()
	s := addStream(t, env.JS, "LATE", "late.>")
	flush(t, p)
	m, err := s.GetLastMsgForSubject(context.Background(), "late.x")
	if err != nil {
		t.Fatalf("republished message not stored: %v", err)
	}
	if got := m.Header.Get(jetstream.MsgIDHeader); got != "ev-1" {
		t.Errorf("Nats-Msg-Id = %q, want ev-1", got)
	}
	if l.has("message lost") || l.has("publish failed") {
		t.Errorf("logs = %v, want none", l.msgs)
	}
}

// TestNoIDNotRepublished checks that a failed publish without a
// Nats-Msg-Id is logged, not published again, and one with an id that
// fails again is logged as lost.
func TestNoIDNotRepublished(t *testing.T) {
	t.Parallel()
	env, p, l := setup(t, Config{})
	stopSilent := unanswered(t, env.NC, "late.x")
	p.Publish(&nats.Msg{Subject: "late.x", Data: []byte("{}")}, "")
	stopSilent()
	s := addStream(t, env.JS, "LATE", "late.>")
	flush(t, p)
	if _, err := s.GetLastMsgForSubject(context.Background(), "late.x"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("stored message = %v, want ErrMsgNotFound (no republish without an id)", err)
	}
	if !l.has("publish failed") {
		t.Errorf("logs = %v, want publish failed", l.msgs)
	}

	defer unanswered(t, env.NC, "silent.x")()
	p.Publish(&nats.Msg{Subject: "silent.x", Data: []byte("{}")}, "ev-2")
	flush(t, p)
	if !l.has("message lost") {
		t.Errorf("logs = %v, want message lost", l.msgs)
	}
}

// TestSettle checks that Settle returns the acknowledgement, and publishes
// a failed publish again even without an id, since its caller waits.
func TestSettle(t *testing.T) {
	t.Parallel()
	env, p, _ := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := p.Async(&nats.Msg{Subject: "stored.y", Data: []byte("{}")})
	if err := p.Settle(ctx, f, ""); err != nil {
		t.Fatalf("Settle = %v, want nil", err)
	}
	if ack, err := f.Ack(); err != nil || ack.Stream != "STORED" || ack.Sequence != 1 {
		t.Errorf("Ack = %+v, %v; want STORED at 1", ack, err)
	}

	stopSilent := unanswered(t, env.NC, "late.x")
	f = p.Async(&nats.Msg{Subject: "late.x", Data: []byte("{}")})
	stopSilent()
	addStream(t, env.JS, "LATE", "late.>")
	if err := p.Settle(ctx, f, ""); err != nil {
		t.Fatalf("Settle of an unanswered publish = %v, want nil (published again)", err)
	}
	if ack, err := f.Ack(); err != nil || ack.Stream != "LATE" || ack.Sequence != 1 {
		t.Errorf("Ack of the republish = %+v, %v; want LATE at 1", ack, err)
	}

	defer unanswered(t, env.NC, "silent.x")()
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if err := p.Settle(cctx, p.Async(&nats.Msg{Subject: "silent.x"}), ""); !errors.Is(err, context.Canceled) {
		t.Errorf("Settle with a cancelled ctx = %v, want context.Canceled", err)
	}
	flush(t, p)
}

// TestFlushDeadline checks that Flush returns when ctx ends before every
// acknowledgement came.
func TestFlushDeadline(t *testing.T) {
	t.Parallel()
	env, p, _ := setup(t, Config{})
	defer unanswered(t, env.NC, "silent.x")()
	p.Publish(&nats.Msg{Subject: "silent.x", Data: []byte("{}")}, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := p.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Flush = %v, want context.DeadlineExceeded", err)
	}
	flush(t, p)
}

// TestNoStream checks that a publish no stream takes fails, waited for or
// not.
func TestNoStream(t *testing.T) {
	t.Parallel()
	_, p, l := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Settle(ctx, p.Async(&nats.Msg{Subject: "nostream.x", Data: []byte("{}")}), ""); err == nil {
		t.Error("Settle of a publish without a stream = nil, want an error")
	}
	p.Publish(&nats.Msg{Subject: "nostream.x", Data: []byte("{}")}, "ev-3")
	flush(t, p)
	if !l.has("message lost") {
		t.Errorf("logs = %v, want message lost", l.msgs)
	}
}

func TestAckError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		data string
		code int
		ok   bool
	}{
		{`{"stream":"GANTRY_AUDIT","seq":12}`, 0, true},
		{`{"stream":"error","seq":1,"duplicate":true}`, 0, true},
		{`{"stream":"KV_gantry_tasks","error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, 503, false},
		{`{"error":`, 0, false},
	} {
		err := ackError(&nats.Msg{Data: []byte(tc.data)})
		if (err == nil) != tc.ok {
			t.Errorf("ackError(%s) = %v, want ok %v", tc.data, err, tc.ok)
		}
		var apiErr *jetstream.APIError
		if tc.code != 0 && (!errors.As(err, &apiErr) || apiErr.Code != tc.code) {
			t.Errorf("ackError(%s) = %v, want an APIError with code %d", tc.data, err, tc.code)
		}
	}
	noResponders := &nats.Msg{Header: nats.Header{"Status": []string{"503"}}}
	if err := ackError(noResponders); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("ackError(no responders) = %v, want ErrNoStreamResponse", err)
	}
}
