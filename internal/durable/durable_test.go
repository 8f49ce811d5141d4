package durable

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// TestRecreatesWhatIsGone: a deleted consumer, then a deleted stream, are
// recreated as provisioned, logged at WARN; messages published after are
// consumed.
func TestRecreatesWhatIsGone(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := jetstream.StreamConfig{Name: "TEST", Subjects: []string{"test.>"}, Retention: jetstream.WorkQueuePolicy}
	if _, err := env.JS.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	var logs syncBuffer
	c, err := Start(ctx, env.JS, Config{
		Stream:        sc,
		Consumer:      jetstream.ConsumerConfig{Durable: "test-consumer", AckPolicy: jetstream.AckExplicitPolicy},
		Handler:       func(m jetstream.Msg) { got.Add(1); _ = m.Ack() },
		CheckInterval: 100 * time.Millisecond,
		Logger:        slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	for i, remove := range []func() error{
		func() error { return env.JS.DeleteConsumer(ctx, "TEST", "test-consumer") },
		func() error { return env.JS.DeleteStream(ctx, "TEST") },
	} {
		if err := remove(); err != nil {
			t.Fatal(err)
		}
		check.For(t, 10*time.Second, 50*time.Millisecond, func() error {
			if err := c.Healthy(); err != nil {
				return err
			}
			if _, err := env.JS.Publish(ctx, "test.x", nil); err != nil {
				return err
			}
			if got.Load() <= int32(i) {
				return fmt.Errorf("consumed %d messages, want %d", got.Load(), i+1)
			}
			return nil
		})
	}
	for msg, n := range map[string]int{"consumer gone": 2, "consumer recreated": 2, "stream was gone": 1} {
		if got := strings.Count(logs.String(), `"level":"WARN","msg":"`+msg); got != n {
			t.Errorf("WARN %q logged %d times, want %d:\n%s", msg, got, n, logs.String())
		}
	}
	info, err := env.JS.Stream(ctx, "TEST")
	if err != nil || info.CachedInfo().Config.Retention != jetstream.WorkQueuePolicy {
		t.Errorf("recreated stream = %v; want it as provisioned (work queue)", err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
