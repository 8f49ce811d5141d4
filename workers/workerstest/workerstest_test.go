package workerstest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/workers"
	"github.com/gantry-dev/gantry/workers/workerstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestClasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		err   error
		class workers.Class
		after time.Duration
	}{
		{"success", nil, workers.ClassSucceeded, 0},
		{"retry", errors.New("flaky"), workers.ClassRetry, 0},
		{"delay", workers.RetryAfter(errors.New("rate limited"), 3*time.Second), workers.ClassDelay, 3 * time.Second},
		{"permanent", workers.Permanent(errors.New("bad input")), workers.ClassPermanent, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := workers.HandlerFunc(func(context.Context, *workers.Task) error { return tc.err })
			res := workerstest.Run(context.Background(), h, workerstest.Task{})
			if res.Class != tc.class || res.RetryAfter != tc.after || !errors.Is(res.Err, tc.err) {
				t.Errorf("Run = %v %v %v, want %v %v %v", res.Class, res.RetryAfter, res.Err, tc.class, tc.after, tc.err)
			}
		})
	}
}

func TestTaskFieldsAndOutput(t *testing.T) {
	t.Parallel()
	h := workers.HandlerFunc(func(ctx context.Context, task *workers.Task) error {
		if task.ID != "t1" || task.Type != "resize" || task.Attempt != 2 || string(task.Payload) != `{"w":64}` {
			return workers.Permanent(errors.New("unexpected task fields"))
		}
		if _, ok := ctx.Deadline(); !ok || task.Deadline.IsZero() {
			return workers.Permanent(errors.New("no deadline"))
		}
		task.SetOutput("resized")
		task.SetResult(json.RawMessage(`{"w":64}`))
		return task.SaveCheckpoint(ctx, wire.Checkpoint{Stage: "done"})
	})
	res := workerstest.Run(context.Background(), h, workerstest.Task{ID: "t1", Type: "resize", Attempt: 2, Payload: `{"w":64}`})
	if res.Class != workers.ClassSucceeded || res.Output != "resized" || string(res.Result) != `{"w":64}` || res.Checkpoint == nil || res.Checkpoint.Stage != "done" {
		t.Errorf("Run = %+v, want succeeded with output, result and checkpoint", res)
	}
}

// An operation key guards a step across a redelivery: the second Run with
// the same Checkpoints does not run it again.
func TestOnceAcrossRedelivery(t *testing.T) {
	t.Parallel()
	runs := 0
	h := workers.HandlerFunc(func(ctx context.Context, task *workers.Task) error {
		if err := task.Once(ctx, "charge", func(context.Context) error { runs++; return nil }); err != nil {
			return err
		}
		if task.Attempt == 1 {
			return errors.New("crash after the charge")
		}
		return nil
	})
	cps := workerstest.NewCheckpoints()
	first := workerstest.Run(context.Background(), h, workerstest.Task{Checkpoints: cps})
	second := workerstest.Run(context.Background(), h, workerstest.Task{Attempt: 2, Checkpoints: cps})
	if first.Class != workers.ClassRetry || second.Class != workers.ClassSucceeded || runs != 1 {
		t.Errorf("classes %v, %v with %d runs of the step, want retry, succeeded and 1", first.Class, second.Class, runs)
	}
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	h := workers.HandlerFunc(func(ctx context.Context, _ *workers.Task) error {
		<-ctx.Done()
		return context.Cause(ctx)
	})
	res := workerstest.Run(context.Background(), h, workerstest.Task{Timeout: 10 * time.Millisecond})
	if res.Class != workers.ClassRetry || !errors.Is(res.Err, workers.ErrTimeout) {
		t.Errorf("Run = %v %v, want a retry caused by ErrTimeout", res.Class, res.Err)
	}
}
