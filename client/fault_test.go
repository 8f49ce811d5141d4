package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/workers"
)

// TestFullDiskLosesNothingAcknowledged: the broker's data dir is on a
// small disk (a tmpfs; skipped loudly where none can be mounted) and a
// worker runs tasks as they come. The disk fills: submits are refused,
// saying the storage is full; once space is freed submits are taken
// again, and every task whose submit was acknowledged — before, during
// and after — ends SUCCEEDED.
func TestFullDiskLosesNothingAcknowledged(t *testing.T) {
	t.Parallel()
	small := brokertest.SmallDisk(t, "24m")
	env := brokertest.Start(t, brokertest.WithDataDir(small+"/data"), func(c *broker.Config) {
		c.MinFreeSpace, c.StorageCheck = 1<<20, 100*time.Millisecond
	})
	c, err := client.Connect(context.Background(), client.Options{Servers: env.URL, Name: t.Name()},
		client.WithLogger(env.Log.With("component", "client")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	b := &bundle{env: env, c: c}
	b.startWorkers(t, workers.Config{}, nil)

	var acked []string
	n := 0
	submit := func() error {
		n++
		id := fmt.Sprintf("disk-%04d", n)
		sctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := c.Submit(sctx, client.Task{ID: id, Type: "noop"})
		if err == nil {
			acked = append(acked, id)
		}
		return err
	}
	for range 20 {
		if err := submit(); err != nil {
			t.Fatal(err)
		}
	}
	free := brokertest.FillDisk(t, small)
	// The first refusals may come before the broker has noticed its
	// storage failing, as a bare time-out; then each says why.
	bare := 0
	check.That(t, 20*time.Second, "a submit refused saying the storage is full", func() bool {
		err := submit()
		if err != nil && !(errors.Is(err, client.ErrUnavailable) && strings.Contains(err.Error(), "storage is full")) {
			bare++
		}
		return errors.Is(err, client.ErrUnavailable) && strings.Contains(err.Error(), "storage is full")
	})
	duringFull := len(acked)

	free()
	freed := time.Now()
	check.That(t, 20*time.Second, "a submit taken again", func() bool { return submit() == nil })
	resumed := time.Since(freed)
	for range 20 {
		if err := submit(); err != nil {
			t.Fatalf("submit after the disk was freed: %v", err)
		}
	}
	waiting := acked
	check.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		var still []string
		for _, id := range waiting {
			rec, err := c.Task(ctx(t, 5*time.Second), id)
			if err != nil || rec.State != client.TaskSucceeded {
				still = append(still, id)
			}
		}
		waiting = still
		if len(still) > 0 {
			return fmt.Errorf("%d acknowledged tasks not SUCCEEDED, e.g. %s", len(still), still[0])
		}
		return nil
	})
	for _, id := range waiting {
		rec, err := c.Task(ctx(t, 5*time.Second), id)
		t.Errorf("acknowledged task %s = %s (%s), %v; want SUCCEEDED", id, rec.State, rec.LastError, err)
	}
	t.Logf("%d tasks acknowledged (%d before the refusal, %d refusals as a bare time-out first), 0 lost; submits taken again %v after the space was freed",
		len(acked), duringFull, bare, resumed.Round(time.Millisecond))
}
