package wire

import (
	"encoding/json"
	"testing"
)

func TestOpsGolden(t *testing.T) {
	t.Parallel()
	cases := map[string]any{
		"queue_state": QueueState{Queue: "plant", Paused: true, Reason: "maintenance", By: "ops@plant-pc-1", UpdatedAt: t0},
		"worker_info": WorkerInfo{Name: "plant-pc-1-4242", Host: "plant-pc-1", PID: 4242, Version: "v1.4.0", Queues: []string{"default"},
			Running: 1, Tasks: []RunningTask{{ID: "task-1", Queue: "default", Type: "exec", Attempt: 2, Resource: "cam1", StartedAt: t0}},
			StartedAt: t0, Heartbeat: t0, TTL: "15s",
			Window: []QueueWindow{{Queue: "default", Since: t0, Running: 1, Succeeded: 10, NeedsReview: 1, Cancelled: 0, Retries: 2,
				Wait: Histogram{Bounds: []float64{0.1, 1}, Counts: []uint64{8, 10}, Count: 11, Sum: 3.5},
				Run:  Histogram{Bounds: []float64{0.1, 1}, Counts: []uint64{1, 9}, Count: 11, Sum: 7.25}}}},
		"alert": Alert{Rule: "review", Kind: "needs_review", Summary: "3 exec tasks need review", Subject: "exec", Count: 3, Since: t0,
			TaskID: "task-1", Queue: "default", Type: "exec", LastError: "exit status 2", Details: json.RawMessage(`{"window":"10m0s"}`)},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, v)
		})
	}
}

func TestOpsEventSubjects(t *testing.T) {
	t.Parallel()
	for typ, want := range map[EventType]string{
		EventQueuePaused:      "gantry.audit.queue.paused",
		EventQueueResumed:     "gantry.audit.queue.resumed",
		EventTaskPurged:       "gantry.audit.task.purged",
		EventAlertNeedsReview: "gantry.audit.alert.needs_review",
		EventAlertAuditLag:    "gantry.audit.alert.audit_lag",
	} {
		if got := typ.Subject(); got != want || !typ.Known() {
			t.Errorf("%s.Subject() = %q (known %v), want %q", typ, got, typ.Known(), want)
		}
	}
}

func TestWorkerKey(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{"plant-pc-1-42": "plant-pc-1-42", "host.local-7": "host_local-7", "": "_", "a b*>": "a_b__"} {
		if got := WorkerKey(name); got != want {
			t.Errorf("WorkerKey(%q) = %q, want %q", name, got, want)
		}
	}
}
