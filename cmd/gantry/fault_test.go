package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// TestBrokerRestartUnderLoad runs gantry split as on several machines — a
// broker, a worker, a scheduler and auditd, each its own process — while a
// client submits tasks (every fourth an exec task) without a pause. The
// broker is killed (SIGKILL) mid-load and started again on its data dir:
// every component logs the loss and the return of the broker and carries
// on (the scheduler leads again), and every task whose submit was acknowledged, before or after the
// kill, ends SUCCEEDED with its TASK_FINISHED in the audit store.
func TestBrokerRestartUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts a broker")
	}
	port := brokertest.FreePorts(t, 1)[0]
	url := "nats://" + addr(port)
	brokerArgs := []string{"broker", "--data", t.TempDir(), "--nats-listen", addr(port), "--http-listen", ""}
	brk := spawn(t, "broker", brokerArgs...)
	brk.waitReady(t, 30*time.Second)
	var comps []*proc
	for _, c := range [][]string{{"worker"}, {"scheduler"}, {"auditd", "--data", t.TempDir()}} {
		comps = append(comps, spawn(t, c[0], append([]string{"--server", url}, append(c, "--http-listen", "")...)...))
	}
	for _, p := range comps {
		p.waitReady(t, 30*time.Second)
	}
	sched := comps[1]

	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc, client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}

	// The load: one submit after another, each bounded; what is
	// acknowledged is the promise.
	var mu sync.Mutex
	var acked []string
	var refused int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			task := client.Task{ID: fmt.Sprintf("load-%05d", i), Type: "noop"}
			if i%4 == 3 {
				task.Type, task.Payload = "exec", wire.ExecPayload{Cmd: []string{"true"}}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Submit(ctx, task)
			cancel()
			mu.Lock()
			if err == nil {
				acked = append(acked, task.ID)
			} else {
				refused++
			}
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	ackedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	atLeast := func(n int) func() error {
		return func() error {
			if got := ackedCount(); got < n {
				return fmt.Errorf("%d tasks acknowledged, want %d", got, n)
			}
			return nil
		}
	}
	poll.For(t, 30*time.Second, 50*time.Millisecond, atLeast(100))

	brk.kill()
	before := ackedCount()
	for _, p := range comps {
		poll.For(t, 10*time.Second, 50*time.Millisecond, func() error {
			if len(p.logged("broker connection lost")) == 0 {
				return fmt.Errorf("%s did not log its disconnect", p.name)
			}
			return nil
		})
	}
	brk = spawn(t, "broker'", brokerArgs...)
	brk.waitReady(t, 30*time.Second)
	back := time.Now()
	poll.For(t, 30*time.Second, 50*time.Millisecond, atLeast(before+1))
	firstAck := time.Since(back)
	for _, p := range comps {
		poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
			if len(p.logged("broker connection back")) == 0 {
				return fmt.Errorf("%s did not log its reconnect", p.name)
			}
			return nil
		})
	}
	// The scheduler leads: it kept its leadership across a short outage,
	// or lost it and is elected again.
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		elected, lost := len(sched.logged(`"leader elected"`)), len(sched.logged(`"no longer leading"`))
		if elected <= lost {
			return fmt.Errorf("scheduler elected %d times, stopped leading %d times; want it leading", elected, lost)
		}
		return nil
	})
	poll.For(t, 30*time.Second, 50*time.Millisecond, atLeast(before+100))
	close(stop)
	wg.Wait()
	t.Logf("%d tasks acknowledged (%d before the kill), %d submits refused or timed out while the broker was down; first acknowledgement %v after the broker was back",
		len(acked), before, refused, firstAck.Round(time.Millisecond))

	// Every acknowledged task ends SUCCEEDED.
	waiting := append([]string(nil), acked...)
	poll.For(t, 60*time.Second, 50*time.Millisecond, func() error {
		var still []string
		for _, id := range waiting {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rec, err := c.Task(ctx, id)
			cancel()
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
	// And has its TASK_FINISHED in the audit store.
	finished := map[string]int{}
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		clear(finished)
		q := client.AuditQuery{Type: wire.EventTaskFinished, Limit: 1000}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			page, err := c.QueryAudit(ctx, q)
			cancel()
			if err != nil {
				return err
			}
			for _, ev := range page.Events {
				finished[ev.TaskID]++
			}
			if page.Cursor == "" {
				break
			}
			q.Cursor = page.Cursor
		}
		for _, id := range acked {
			if finished[id] == 0 {
				return fmt.Errorf("%d TASK_FINISHED stored, none for acknowledged task %s", len(finished), id)
			}
		}
		return nil
	})
	twice := 0
	for _, n := range finished {
		if n > 1 {
			twice++
		}
	}
	t.Logf("lost: 0 of %d acknowledged tasks; %d tasks with more than one TASK_FINISHED (redelivered across the kill)", len(acked), twice)
	for _, p := range comps {
		p.stop(t)
	}
}
