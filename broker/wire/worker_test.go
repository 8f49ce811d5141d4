package wire

import (
	"encoding/json"
	"testing"
	"time"
)

func TestWorkerGolden(t *testing.T) {
	t.Parallel()
	nb := t0.Add(time.Hour)
	cases := map[string]any{
		"task_record": TaskRecord{
			TaskInfo: TaskInfo{
				ID: "task-1", Type: "exec", Queue: "default", State: TaskNeedsReview, Attempts: 3,
				LastError: "exit status 1", Resource: "cam1", CreatedAt: t0, UpdatedAt: t0,
			},
			Deliveries: 4, Delays: 1, MaxAttempts: 3, Priority: 2, Key: "k-1", NotBefore: &nb, RetryAt: &nb,
			Seq: 42, Worker: "pc-1-123", Job: "tick", Output: "boom\n", Result: json.RawMessage(`{"rows_affected":1}`),
			Kept:    "gantry.review.task-1",
			Message: &StoredMessage{Subject: "gantry.tasks.default.exec", Header: map[string][]string{"Gantry-Job": {"tick"}}, Data: []byte(`{"id":"task-1"}`)},
		},
		"checkpoint": Checkpoint{
			Stage: "upload", LastItem: "file-17", Counts: map[string]int64{"done": 17, "failed": 1},
			ResumeArgs: json.RawMessage(`{"offset":17}`), Lease: "cam1", Attempt: 2, UpdatedAt: t0,
		},
		"handler_request": HandlerRequest{
			ID: "task-1", Type: "resize", Queue: "default", Attempt: 1, Payload: json.RawMessage(`{"w":10}`),
			Checkpoint: &Checkpoint{Stage: "s", UpdatedAt: t0}, Deadline: t0,
		},
		"task_cancel_request": TaskCancelRequest{ID: "task-1"},
		"task_cancel_reply":   TaskCancelReply{ID: "task-1", Action: CancelStopping, Worker: "pc-1-123"},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, v)
		})
	}
}

func TestValidTaskID(t *testing.T) {
	t.Parallel()
	long := make([]byte, MaxTaskIDLen+1)
	for i := range long {
		long[i] = 'a'
	}
	for id, want := range map[string]bool{
		"task-1": true, "01JDZ0000000000000000000AA": true, "job_a-1700000000": true, "a=b": true,
		"": false, "a.b": false, "a b": false, "a*": false, "a>": false, "é": false,
		string(long): false, string(long[1:]): true,
	} {
		if got := ValidTaskID(id); got != want {
			t.Errorf("ValidTaskID(%q) = %v, want %v", id, got, want)
		}
	}
}
