package lease_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/lease"
)

// runClients splits b.N operations across clients goroutines, each with its
// own connection (made by setup before the timer starts), and reports ops/s.
func runClients[T any](b *testing.B, clients int, setup func(c int) T, op func(ctx context.Context, st T, c, i int) error, flush func(ctx context.Context, st T) error) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	states := make([]T, clients)
	for c := range clients {
		states[c] = setup(c)
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		n := b.N / clients
		if c < b.N%clients {
			n++
		}
		wg.Go(func() {
			for i := range n {
				if err := op(ctx, states[c], c, i); err != nil {
					b.Error(err)
					return
				}
			}
			if err := flush(ctx, states[c]); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

// leasesBucket connects to url and returns the raw leases bucket.
func leasesBucket(b *testing.B, url string) jetstream.KeyValue {
	b.Helper()
	_, js := brokertest.Connect(b, url)
	bucket, err := js.KeyValue(context.Background(), wire.BucketLeases)
	if err != nil {
		b.Fatal(err)
	}
	return bucket
}

// BenchmarkLease measures acquire+release cycles against raw KV puts on the
// same broker in the same run.
func BenchmarkLease(b *testing.B) {
	env := brokertest.Start(b)
	value := []byte(`{"resource":"r","owner":"o","expires_at":"2026-11-30T00:00:00Z","ttl":"30s"}`)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("raw_kv_put/clients=%d", clients), func(b *testing.B) {
			runClients(b, clients, func(int) jetstream.KeyValue { return leasesBucket(b, env.URL) }, func(ctx context.Context, bucket jetstream.KeyValue, c, _ int) error {
				_, err := bucket.Put(ctx, fmt.Sprintf("raw-%d", c), value)
				return err
			}, func(context.Context, jetstream.KeyValue) error { return nil })
		})
		b.Run(fmt.Sprintf("raw_kv_create_ttl_delete/clients=%d", clients), func(b *testing.B) {
			runClients(b, clients, func(int) jetstream.KeyValue { return leasesBucket(b, env.URL) }, func(ctx context.Context, bucket jetstream.KeyValue, c, _ int) error {
				key := fmt.Sprintf("rawcd-%d", c)
				rev, err := bucket.Create(ctx, key, value, jetstream.KeyTTL(30*time.Second))
				if err != nil {
					return err
				}
				return bucket.Delete(ctx, key, jetstream.LastRevision(rev))
			}, func(context.Context, jetstream.KeyValue) error { return nil })
		})
		b.Run(fmt.Sprintf("acquire_release/clients=%d", clients), func(b *testing.B) {
			runClients(b, clients, func(int) *lease.Leases {
				_, js := brokertest.Connect(b, env.URL)
				l, err := lease.NewLeases(js, lease.LeasesConfig{Audit: audit.NewEmitter(js, "bench", nil)})
				if err != nil {
					b.Fatal(err)
				}
				return l
			}, func(ctx context.Context, l *lease.Leases, c, _ int) error {
				ls, err := l.Acquire(ctx, fmt.Sprintf("res-%d", c), fmt.Sprintf("owner-%d", c), 30*time.Second)
				if err != nil {
					return err
				}
				return l.Release(ctx, ls)
			}, func(ctx context.Context, l *lease.Leases) error { return l.Flush(ctx) })
		})
		b.Run(fmt.Sprintf("resource_lease_finish/clients=%d", clients), func(b *testing.B) {
			runClients(b, clients, func(c int) *lease.Resources {
				_, js := brokertest.Connect(b, env.URL)
				r, err := lease.NewResources(js, lease.ResourcesConfig{Audit: audit.NewEmitter(js, "bench", nil)})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := r.Add(context.Background(), lease.ResourceSpec{ID: fmt.Sprintf("dev-%d", c)}); err != nil {
					b.Fatal(err)
				}
				return r
			}, func(ctx context.Context, r *lease.Resources, c, _ int) error {
				rh, err := r.Lease(ctx, fmt.Sprintf("dev-%d", c), fmt.Sprintf("owner-%d", c), 30*time.Second)
				if err != nil {
					return err
				}
				if err := rh.Start(ctx); err != nil {
					return err
				}
				return rh.Finish(ctx, lease.Outcome{})
			}, func(ctx context.Context, r *lease.Resources) error { return r.Flush(ctx) })
		})
	}
}

// BenchmarkWake measures how soon a waiter in line takes a resource once
// its holder releases it, against how soon a raw KV watcher sees a put on
// the same broker in the same run. The waiter and the holder are two
// stores on two connections (two processes); each iteration the waiter
// takes its place and is seen in line first (not timed), then the holder
// finishes, and the time from the start of Finish to the waiter's resource
// RUNNING under it is one sample. Reports p50 and p99 in µs; ns/op
// includes the untimed set-up.
func BenchmarkWake(b *testing.B) {
	env := brokertest.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.Run("raw_kv_watch", func(b *testing.B) {
		bucket := leasesBucket(b, env.URL)
		w, err := bucket.Watch(ctx, "raw", jetstream.UpdatesOnly())
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = w.Stop() }()
		lat := make([]time.Duration, 0, b.N)
		for i := 0; b.Loop(); i++ {
			start := time.Now()
			if _, err := bucket.Put(ctx, "raw", []byte(fmt.Sprint(i))); err != nil {
				b.Fatal(err)
			}
			for e := range w.Updates() {
				if e != nil && string(e.Value()) == fmt.Sprint(i) {
					break
				}
			}
			lat = append(lat, time.Since(start))
		}
		reportLatency(b, lat)
	})
	b.Run("release_to_running", func(b *testing.B) {
		stores := [2]*lease.Resources{}
		for i := range stores {
			_, js := brokertest.Connect(b, env.URL)
			r, err := lease.NewResources(js, lease.ResourcesConfig{Audit: audit.NewEmitter(js, "bench", nil)})
			if err != nil {
				b.Fatal(err)
			}
			stores[i] = r
		}
		if _, err := stores[0].Add(ctx, lease.ResourceSpec{ID: "dev"}); err != nil {
			b.Fatal(err)
		}
		holder, err := stores[0].Lease(ctx, "dev", "owner-0", 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := holder.Start(ctx); err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, b.N)
		for i := 0; b.Loop(); i++ {
			next := stores[(i+1)%2]
			inLine := make(chan struct{})
			var once sync.Once
			type result struct {
				rh  *lease.ResourceHolder
				err error
				at  time.Time
			}
			done := make(chan result, 1)
			go func() {
				rh, err := next.LeaseWait(ctx, "dev", fmt.Sprintf("owner-%d", i+1), 30*time.Second, lease.WaitOptions{
					OnChange: func(s lease.WaitStatus) {
						if s.Position == 1 && s.Holder != "" {
							once.Do(func() { close(inLine) })
						}
					},
				})
				if err == nil {
					err = rh.Start(ctx)
				}
				done <- result{rh, err, time.Now()}
			}()
			<-inLine
			start := time.Now()
			if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
				b.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				b.Fatal(r.err)
			}
			lat = append(lat, r.at.Sub(start))
			holder = r.rh
		}
		if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
			b.Fatal(err)
		}
		reportLatency(b, lat)
		for _, r := range stores {
			if err := r.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// reportLatency reports the p50 and p99 of lat in µs.
func reportLatency(b *testing.B, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}
