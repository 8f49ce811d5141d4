package audit_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestEmit(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	at := time.Date(2026, 11, 30, 3, 12, 0, 0, time.UTC)
	em := audit.NewEmitter(env.JS, "workers", clock.NewFake(at))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := em.Emit(ctx, wire.Event{
		Type: wire.EventTaskFinished, TaskID: "t1",
		Payload: audit.Payload(map[string]any{"state": "SUCCEEDED", "env": map[string]any{"API_TOKEN": "x"}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := env.JS.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, "gantry.audit.task.finished")
	if err != nil {
		t.Fatalf("no event on gantry.audit.task.finished: %v", err)
	}
	var ev wire.Event
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.ID == "" || !ev.Time.Equal(at) || ev.Component != "workers" || ev.Host == "" || ev.Level != wire.LevelInfo {
		t.Errorf("event = %+v, want id, time %v, component workers, a host and level info", ev, at)
	}
	if got, want := string(ev.Payload), `{"env":{"API_TOKEN":"[REDACTED]"},"state":"SUCCEEDED"}`; got != want {
		t.Errorf("payload = %s, want %s", got, want)
	}
	if got := msg.Header.Get(jetstream.MsgIDHeader); got != ev.ID {
		t.Errorf("Nats-Msg-Id = %q, want the event id %q", got, ev.ID)
	}
}
