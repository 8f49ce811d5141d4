package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/tasks"
)

func TestNewMsg(t *testing.T) {
	t.Parallel()
	task := wire.Task{ID: "t-1", Payload: json.RawMessage(`{"sleep":"1s"}`), Resource: "cam1", Priority: 3, MaxAttempts: 2, Timeout: "30s", Key: "k"}
	msg, err := tasks.NewMsg("", "noop", task)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "gantry.tasks.default.noop" || msg.Header.Get(jetstream.MsgIDHeader) != "t-1" {
		t.Errorf("NewMsg = subject %s, Nats-Msg-Id %q; want gantry.tasks.default.noop, t-1", msg.Subject, msg.Header.Get(jetstream.MsgIDHeader))
	}
	var got wire.Task
	if err := json.Unmarshal(msg.Data, &got); err != nil || got.ID != "t-1" || got.Key != "k" || got.Timeout != "30s" || string(got.Payload) != `{"sleep":"1s"}` {
		t.Errorf("body = %s (%v), want the task", msg.Data, err)
	}

	for name, tc := range map[string]struct {
		queue, typ string
		task       wire.Task
	}{
		"type":         {"", "no.op", wire.Task{ID: "a"}},
		"queue":        {"q q", "noop", wire.Task{ID: "a"}},
		"no id":        {"", "noop", wire.Task{}},
		"id":           {"", "noop", wire.Task{ID: "a b"}},
		"resource":     {"", "noop", wire.Task{ID: "a", Resource: "cam.1"}},
		"max attempts": {"", "noop", wire.Task{ID: "a", MaxAttempts: -1}},
		"timeout":      {"", "noop", wire.Task{ID: "a", Timeout: "soon"}},
		"zero timeout": {"", "noop", wire.Task{ID: "a", Timeout: "0s"}},
	} {
		if _, err := tasks.NewMsg(tc.queue, tc.typ, tc.task); !errors.Is(err, tasks.ErrInvalid) || !errors.Is(err, kv.ErrInvalid) {
			t.Errorf("%s: NewMsg = %v, want ErrInvalid", name, err)
		}
	}
}

// TestNewMsgDedupes publishes the same task twice: the stream keeps one.
func TestNewMsgDedupes(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var acks []*jetstream.PubAck
	for range 2 {
		msg, err := tasks.NewMsg("plant", "exec", wire.Task{ID: "once"})
		if err != nil {
			t.Fatal(err)
		}
		ack, err := env.JS.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, ack)
	}
	if acks[0].Duplicate || !acks[1].Duplicate || acks[0].Stream != wire.StreamTasks {
		t.Errorf("acks = %+v, %+v; want the second a duplicate in %s", acks[0], acks[1], wire.StreamTasks)
	}
	if _, err := tasks.NewMsg("plant", "exec", wire.Task{ID: strings.Repeat("x", wire.MaxTaskIDLen+1)}); err == nil {
		t.Error("NewMsg with a too long id = nil, want an error")
	}
}
