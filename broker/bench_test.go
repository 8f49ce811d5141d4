package broker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

// BenchmarkPublishSync measures what each sync policy costs a JetStream
// publish: async (pipelined) and sync (one at a time) on one client.
func BenchmarkPublishSync(b *testing.B) {
	for _, policy := range []broker.SyncPolicy{broker.SyncInterval, broker.SyncAlways} {
		b.Run(string(policy)+"/async", func(b *testing.B) {
			env := brokertest.Start(b, brokertest.WithSync(policy))
			data := []byte(`{"payload":{"sleep":"0s"}}`)
			subj := wire.TaskSubject("bench", "noop")
			for b.Loop() {
				for {
					_, err := env.JS.PublishAsync(subj, data)
					if err == nil {
						break
					}
					if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
						b.Fatal(err)
					}
				}
			}
			<-env.JS.PublishAsyncComplete()
		})
		b.Run(string(policy)+"/sync", func(b *testing.B) {
			env := brokertest.Start(b, brokertest.WithSync(policy))
			data := []byte(`{"payload":{"sleep":"0s"}}`)
			subj := wire.TaskSubject("bench", "noop")
			ctx := context.Background()
			for b.Loop() {
				if _, err := env.JS.Publish(ctx, subj, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
