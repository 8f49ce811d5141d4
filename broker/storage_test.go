package broker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/rpc"
)

// TestFullDiskRecovers: the broker's data dir on a small disk that fills.
// The write that fails makes the broker unready, and says so to any client
// on gantry.api.broker.health; once space is freed, JetStream is restarted
// on its own, the tasks stream takes writes again, and nothing
// acknowledged before is lost.
func TestFullDiskRecovers(t *testing.T) {
	t.Parallel()
	small := brokertest.SmallDisk(t, "24m")
	env := brokertest.Start(t, brokertest.WithDataDir(small+"/data"), func(c *broker.Config) {
		c.MinFreeSpace, c.StorageCheck = 1<<20, 100*time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	publish := func(i int) error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := env.JS.Publish(pctx, wire.TaskSubject("", "noop"), fmt.Appendf(nil, `{"id":"t-%d"}`, i))
		return err
	}
	acked := 0
	for ; acked < 10; acked++ {
		if err := publish(acked); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Broker.Healthy(); err != nil {
		t.Fatalf("Healthy before the disk fills = %v, want nil", err)
	}
	free := brokertest.FillDisk(t, small)
	// The block a stream writes to may have room for a few more.
	check.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		if err := publish(acked); err == nil {
			acked++
			return errors.New("publish still acknowledged")
		}
		return nil
	})
	if err := env.Broker.Healthy(); !errors.Is(err, broker.ErrStorage) {
		t.Errorf("Healthy on a full disk = %v, want ErrStorage", err)
	}
	var h wire.BrokerHealth
	if err := rpc.Request(ctx, env.NC, wire.SubjectBrokerHealth, nil, &h); err != nil || h.StorageOK || h.Error == "" {
		t.Errorf("broker health = %+v, %v; want storage not ok, saying why", h, err)
	}

	free()
	check.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		if err := env.Broker.Healthy(); err != nil {
			return err
		}
		return publish(acked)
	})
	acked++
	stream, err := env.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := int(info.State.Msgs); got < acked {
		t.Errorf("tasks in the stream = %d, want every one of the %d acknowledged", got, acked)
	}
}
