package auditd

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
)

// benchEvent is a typical event: a task finishing on a resource, with a
// small payload.
func benchEvent(i int, at time.Time) wire.Event {
	return wire.Event{
		ID:         fmt.Sprintf("01JDZ%021d", i),
		Time:       at,
		Type:       wire.EventTaskFinished,
		Level:      wire.LevelInfo,
		Component:  "workers",
		Host:       "plant-pc-1",
		TaskID:     fmt.Sprintf("task-%d", i/10),
		ResourceID: fmt.Sprintf("cam%d", i%8),
		RouteID:    "office",
		JobID:      fmt.Sprintf("job-%d", i%50),
		Message:    "task finished",
		Payload:    json.RawMessage(`{"attempts":1,"state":"SUCCEEDED"}`),
	}
}

// openRaw opens a bare Pebble database with the store's options.
func openRaw(b *testing.B, dir string) *pebble.DB {
	b.Helper()
	opts := pebbleOptions(vfs.Default, slog.New(slog.DiscardHandler))
	defer opts.Cache.Unref()
	db, err := pebble.Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	return db
}

// pipelineEvent is event i of a task's usual life: created, resource
// leased, started, resource released, finished. Such events set two or
// three indexed fields, not all six.
func pipelineEvent(i int, at time.Time) wire.Event {
	ev := benchEvent(i, at)
	ev.RouteID, ev.JobID = "", ""
	switch i % 5 {
	case 0:
		ev.Type, ev.ResourceID = wire.EventTaskCreated, ""
	case 1:
		ev.Type, ev.TaskID = wire.EventResourceLeased, ""
	case 2:
		ev.Type = wire.EventTaskStarted
	case 3:
		ev.Type, ev.TaskID = wire.EventResourceReleased, ""
	}
	return ev
}

// BenchmarkIngest compares the store's write path (validate, redact,
// encode, the event plus its index keys, synced commit) with raw Pebble
// batches of the same encoded events under their ids, with the same options
// and synced the same way. Both write batches of 512 events, alternately in
// each iteration, so that the noise of a shared machine hits both alike;
// the ratio is store/raw. "all-fields" events set every indexed field
// (task, resource, route, job, type; level info is not indexed);
// "pipeline" events are a task's usual mix.
func BenchmarkIngest(b *testing.B) {
	const batch = 512
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, gen := range []struct {
		name  string
		event func(int, time.Time) wire.Event
	}{{"all-fields", benchEvent}, {"pipeline", pipelineEvent}} {
		b.Run(gen.name, func(b *testing.B) {
			db := openRaw(b, b.TempDir())
			s, err := OpenStore(b.TempDir(), StoreOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			var rawTime, storeTime time.Duration
			i := 0
			evs := make([]wire.Event, batch)
			for b.Loop() {
				for k := range evs {
					evs[k] = gen.event(i+k, t0.Add(time.Duration(i+k)*time.Millisecond))
				}
				start := time.Now()
				bt := db.NewBatch()
				for k := range evs {
					val, err := json.Marshal(evs[k])
					if err != nil {
						b.Fatal(err)
					}
					if err := bt.Set([]byte(evs[k].ID), val, nil); err != nil {
						b.Fatal(err)
					}
				}
				if err := bt.Commit(pebble.Sync); err != nil {
					b.Fatal(err)
				}
				_ = bt.Close()
				rawTime += time.Since(start)

				start = time.Now()
				if _, err := s.Write(evs); err != nil {
					b.Fatal(err)
				}
				storeTime += time.Since(start)
				i += batch
			}
			b.ReportMetric(float64(i)/rawTime.Seconds(), "raw-events/s")
			b.ReportMetric(float64(i)/storeTime.Seconds(), "store-events/s")
			b.ReportMetric(rawTime.Seconds()/storeTime.Seconds(), "store/raw")
		})
	}
}

// BenchmarkQueryByTask measures `audit query --task` on a store of
// 1,000,000 events (100,000 tasks of 10 events, over ten days), built
// directly through Store.Write in batches of 5,000, not through NATS. The
// baseline is raw Pebble holding the same events under <task>\x00<id>, the
// ideal layout for this one question, read with one prefix scan. Both are
// asked alternately, for the same task, in each iteration.
func BenchmarkQueryByTask(b *testing.B) {
	const (
		n     = 1_000_000
		chunk = 5000
		tasks = n / 10
	)
	t0 := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	step := 10 * 24 * time.Hour / n
	s, err := OpenStore(b.TempDir(), StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	raw := openRaw(b, b.TempDir())
	evs := make([]wire.Event, chunk)
	for base := 0; base < n; base += chunk {
		rb := raw.NewBatch()
		for k := range evs {
			i := base + k
			evs[k] = benchEvent(i, t0.Add(time.Duration(i)*step))
			val, _ := json.Marshal(evs[k])
			_ = rb.Set([]byte(evs[k].TaskID+"\x00"+evs[k].ID), val, nil)
		}
		if err := rb.Commit(pebble.Sync); err != nil {
			b.Fatal(err)
		}
		_ = rb.Close()
		if _, err := s.Write(evs); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Each iteration asks both for the same random task, alternately, so
	// that the noise of a shared machine hits both alike.
	var rawLat, storeLat []time.Duration
	for b.Loop() {
		task := fmt.Sprintf("task-%d", rng.IntN(tasks))
		start := time.Now()
		prefix := []byte(task + "\x00")
		it, err := raw.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
		if err != nil {
			b.Fatal(err)
		}
		got := 0
		for valid := it.First(); valid; valid = it.Next() {
			var ev wire.Event
			if err := json.Unmarshal(it.Value(), &ev); err != nil {
				b.Fatal(err)
			}
			got++
		}
		_ = it.Close()
		rawLat = append(rawLat, time.Since(start))
		if got != 10 {
			b.Fatalf("raw scan of %s = %d events, want 10", task, got)
		}

		start = time.Now()
		page, err := s.Query(wire.AuditQuery{TaskID: task})
		storeLat = append(storeLat, time.Since(start))
		if err != nil || len(page.Events) != 10 {
			b.Fatalf("query %s = %d events, %v; want 10", task, len(page.Events), err)
		}
	}
	reportLatency(b, "raw", rawLat)
	reportLatency(b, "store", storeLat)
}

func reportLatency(b *testing.B, name string, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), name+"-p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), name+"-p99-µs")
}

// BenchmarkSink measures auditd end to end: 20,000 events already in the
// GANTRY_AUDIT stream, from the moment the sink is ready (store open,
// consumer and service set up) until all are stored. The baseline, in the same run and on the same
// broker, is a raw durable pull consumer that acknowledges each message
// and stores nothing.
func BenchmarkSink(b *testing.B) {
	const n = 20000
	t0 := time.Now()
	var rawTime, sinkTime time.Duration
	rounds := 0
	for b.Loop() {
		env := brokertest.Start(b)
		evs := make([]wire.Event, n)
		for i := range evs {
			evs[i] = pipelineEvent(i, t0.Add(time.Duration(i)*time.Microsecond))
		}
		publishBench(b, env.JS, evs)

		start := time.Now()
		consumeRaw(b, env.JS, n)
		rawTime += time.Since(start)

		s, err := New(Config{Dir: filepath.Join(b.TempDir(), "audit"), Logger: env.Log}, env.NC)
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background()) }()
		<-s.Ready()
		start = time.Now()
		check.For(b, time.Minute, time.Millisecond, func() error {
			if got := s.Stats().Stored; got < n {
				return fmt.Errorf("stored = %d, want %d", got, n)
			}
			return nil
		})
		sinkTime += time.Since(start)
		s.Stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		rounds++
	}
	b.ReportMetric(float64(rounds*n)/rawTime.Seconds(), "raw-consume-msgs/s")
	b.ReportMetric(float64(rounds*n)/sinkTime.Seconds(), "sink-events/s")
	b.ReportMetric(rawTime.Seconds()/sinkTime.Seconds(), "sink/raw")
}

func publishBench(b *testing.B, js jetstream.JetStream, evs []wire.Event) {
	b.Helper()
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(ev.Type.Subject(), data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publish did not complete")
	}
}

// consumeRaw reads n messages of the audit stream with a durable pull
// consumer configured like auditd's, acknowledging each.
func consumeRaw(b *testing.B, js jetstream.JetStream, n int) {
	b.Helper()
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, wire.StreamAudit, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 2048, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		b.Fatal(err)
	}
	got := make(chan struct{}, n)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		got <- struct{}{}
	}, jetstream.PullMaxMessages(512))
	if err != nil {
		b.Fatal(err)
	}
	for range n {
		<-got
	}
	cc.Stop()
}
