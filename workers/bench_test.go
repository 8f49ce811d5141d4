package workers

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
)

// publishAll publishes n task messages asynchronously on subject, with the
// header key: value when key is set.
func publishAll(b *testing.B, js jetstream.JetStream, subject string, n int, hdr ...string) {
	b.Helper()
	data := []byte(`{"payload":{}}`)
	for i := 0; i < n; i++ {
		for {
			m := nats.NewMsg(subject)
			m.Data = data
			if len(hdr) == 2 {
				m.Header.Set(hdr[0], hdr[1])
			}
			_, err := js.PublishMsgAsync(m)
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				b.Error(err)
				return
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Error("publishes not acknowledged within 1m")
	}
}

// waitCount waits until count reaches n.
func waitCount(b *testing.B, count *atomic.Int64, n int64) {
	b.Helper()
	check.For(b, 2*time.Minute, time.Millisecond, func() error {
		if got := count.Load(); got < n {
			return fmt.Errorf("count = %d, want %d", got, n)
		}
		return nil
	})
}

// rawConsume publishes b.N messages and consumes them with a durable pull
// consumer and explicit acks, doing extra asynchronous publishes per
// message first: the JetStream ceiling a task pipeline is measured against.
func rawConsume(b *testing.B, extra int, msgID, kvPut bool) {
	env := brokertest.Start(b)
	ctx := context.Background()
	js, err := jetstream.New(env.NC, jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		b.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, wire.StreamTasks, jetstream.ConsumerConfig{
		Durable: "raw", FilterSubject: wire.TaskSubject("raw", ">"), AckPolicy: jetstream.AckExplicitPolicy,
		MaxAckPending: 1024,
	})
	if err != nil {
		b.Fatal(err)
	}
	var count atomic.Int64
	cc, err := cons.Consume(func(m jetstream.Msg) {
		for i := 0; i < extra; i++ {
			em := nats.NewMsg(wire.SubjectAuditPrefix + ".bench.x")
			em.Data = m.Data()
			if msgID {
				em.Header.Set(jetstream.MsgIDHeader, ulid.Make().String())
			}
			if _, err := js.PublishMsgAsync(em); err != nil {
				b.Error(err)
			}
		}
		if kvPut {
			if _, err := js.PublishAsync("$KV."+wire.BucketTasks+"."+ulid.Make().String(), m.Data()); err != nil {
				b.Error(err)
			}
		}
		_ = m.Ack()
		count.Add(1)
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	_, pjs := brokertest.Connect(b, env.URL)
	b.ResetTimer()
	start := time.Now()
	publishAll(b, pjs, wire.TaskSubject("raw", "noop"), b.N)
	waitCount(b, &count, int64(b.N))
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkEndToEnd compares gantry's end-to-end noop tasks (publish →
// TASK_FINISHED observed) with raw JetStream publish and consume in the
// same run, and shows what extra writes per message cost the raw path.
func BenchmarkEndToEnd(b *testing.B) {
	b.Run("raw", func(b *testing.B) { rawConsume(b, 0, false, false) })
	b.Run("raw+1write", func(b *testing.B) { rawConsume(b, 1, false, false) })
	// A task's record: one KV put on a key of its own.
	b.Run("raw+1kvput", func(b *testing.B) { rawConsume(b, 0, false, true) })
	b.Run("raw+3writes+1kvput", func(b *testing.B) { rawConsume(b, 3, false, true) })
	// With a Nats-Msg-Id on each write, which the stream tracks for
	// deduplication, as internal/audit's Emit does.
	b.Run("raw+3writes-with-msg-id+1kvput", func(b *testing.B) { rawConsume(b, 3, true, true) })
	for _, tc := range []struct {
		name string
		conc int
		hdr  []string
	}{
		{"concurrency=256", 256, nil},
		{"concurrency=1024", 1024, nil},
		// As from gantry submit, which emits TASK_CREATED itself: one
		// audit event less per task for the worker.
		{"concurrency=256/created-by-publisher", 256, []string{wire.HeaderCreated, "1"}},
	} {
		conc := tc.conc
		b.Run("gantry-noop/"+tc.name, func(b *testing.B) {
			env, finished := startBenchWorkers(b, conc, false)
			_, pjs := brokertest.Connect(b, env.URL)
			b.ResetTimer()
			start := time.Now()
			publishAll(b, pjs, wire.TaskSubject("bench", "noop"), b.N, tc.hdr...)
			waitCount(b, finished, int64(b.N))
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
		})
	}
	// A prioritized queue: every task also passes through the sorter.
	b.Run("gantry-noop-prioritized/concurrency=256", func(b *testing.B) {
		env, finished := startBenchWorkers(b, 256, true)
		_, pjs := brokertest.Connect(b, env.URL)
		b.ResetTimer()
		start := time.Now()
		publishAll(b, pjs, wire.TaskSubject("bench", "noop"), b.N)
		waitCount(b, finished, int64(b.N))
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
	})
}

// ratioPerOp is how many raw messages, and how many gantry tasks,
// BenchmarkRatio runs per iteration: enough for a throughput, so that
// -benchtime 1x measures one (b.N messages would time a single task).
const ratioPerOp = 40000

// BenchmarkRatio runs raw JetStream publish+consume, gantry noop tasks
// (concurrency 256) and the same on a prioritized queue in alternating
// chunks of 2000 on three brokers, so that the noise of a shared machine
// hits all alike, and reports the rates and their ratios to raw. Each
// iteration is ratioPerOp messages and tasks of each.
func BenchmarkRatio(b *testing.B) {
	ctx := context.Background()
	// Raw: a durable pull consumer acking every message.
	rawEnv := brokertest.Start(b)
	cons, err := rawEnv.JS.CreateOrUpdateConsumer(ctx, wire.StreamTasks, jetstream.ConsumerConfig{
		Durable: "raw", FilterSubject: wire.TaskSubject("raw", ">"), AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1024,
	})
	if err != nil {
		b.Fatal(err)
	}
	var rawCount atomic.Int64
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		rawCount.Add(1)
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	_, rawPub := brokertest.Connect(b, rawEnv.URL)

	// gantry: workers, and a subscriber counting TASK_FINISHED; then the
	// same on a prioritized queue.
	env, finished := startBenchWorkers(b, 256, false)
	_, pub := brokertest.Connect(b, env.URL)
	penv, pfinished := startBenchWorkers(b, 256, true)
	_, ppub := brokertest.Connect(b, penv.URL)

	const chunk = 2000
	total := b.N * ratioPerOp
	var rawTime, gantryTime, prioTime time.Duration
	b.ResetTimer()
	for left := total; left > 0; left -= chunk {
		n := min(chunk, left)
		start := time.Now()
		publishAll(b, rawPub, wire.TaskSubject("raw", "noop"), n)
		waitCount(b, &rawCount, int64(total-left+n))
		rawTime += time.Since(start)
		start = time.Now()
		publishAll(b, pub, wire.TaskSubject("bench", "noop"), n)
		waitCount(b, finished, int64(total-left+n))
		gantryTime += time.Since(start)
		start = time.Now()
		publishAll(b, ppub, wire.TaskSubject("bench", "noop"), n)
		waitCount(b, pfinished, int64(total-left+n))
		prioTime += time.Since(start)
	}
	raw := float64(total) / rawTime.Seconds()
	gantry := float64(total) / gantryTime.Seconds()
	prio := float64(total) / prioTime.Seconds()
	b.ReportMetric(raw, "raw-msgs/s")
	b.ReportMetric(gantry, "gantry-tasks/s")
	b.ReportMetric(100*gantry/raw, "%-of-raw")
	b.ReportMetric(prio, "prioritized-tasks/s")
	b.ReportMetric(100*prio/raw, "prioritized-%-of-raw")
}

// startBenchWorkers starts a broker and workers on queue "bench" with conc
// concurrency (prioritized or not), stopped by b.Cleanup, and counts the
// TASK_FINISHED events.
func startBenchWorkers(b *testing.B, conc int, prioritized bool) (*brokertest.Env, *atomic.Int64) {
	b.Helper()
	env := brokertest.Start(b)
	nc, _ := brokertest.Connect(b, env.URL)
	w, err := New(Config{Queues: []Queue{{Name: "bench", Concurrency: conc, Prioritized: prioritized}}, Logger: env.Log}, nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.Cleanup(func() {
		w.Stop()
		<-done
		cancel()
	})
	<-w.Ready()
	finished := new(atomic.Int64)
	snc, _ := brokertest.Connect(b, env.URL)
	sub, err := snc.Subscribe(wire.EventTaskFinished.Subject(), func(*nats.Msg) { finished.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = sub.SetPendingLimits(-1, -1)
	return env, finished
}
