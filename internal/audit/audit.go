// Package audit publishes audit events. Every component emits through an
// Emitter, which stamps an event with its ULID, time, component and host,
// redacts secret-looking payload keys and publishes it into the audit stream
// on the event type's subject.
package audit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/kv"
)

// Emitter publishes audit events for one component.
type Emitter struct {
	js        jetstream.JetStream
	component string
	host      string
	clock     clock.Clock
}

// NewEmitter returns an emitter that stamps events with component. Host
// defaults to the machine's host name, clk to the real clock.
func NewEmitter(js jetstream.JetStream, component string, clk clock.Clock) *Emitter {
	host, _ := os.Hostname()
	return &Emitter{js: js, component: component, host: cmp.Or(host, "unknown"), clock: cmp.Or[clock.Clock](clk, clock.Real{})}
}

// Stamp fills ev's ID, Time, Component, Host and Level where unset and
// redacts its payload. Emit calls it; it is exported for code that builds
// events to publish itself in bulk.
func (e *Emitter) Stamp(ev *wire.Event) {
	if ev.Time.IsZero() {
		ev.Time = e.clock.Now()
	}
	if ev.ID == "" {
		ev.ID = ulid.MustNew(ulid.Timestamp(ev.Time), ulid.DefaultEntropy()).String()
	}
	ev.Component = cmp.Or(ev.Component, e.component)
	ev.Host = cmp.Or(ev.Host, e.host)
	ev.Level = cmp.Or(ev.Level, wire.LevelInfo)
	wire.RedactEvent(ev)
}

// Emit stamps ev and publishes it into the audit stream, waiting for the
// stream's acknowledgement. The event id doubles as Nats-Msg-Id, so a retried
// publish is stored once.
func (e *Emitter) Emit(ctx context.Context, ev wire.Event) error {
	msg, err := e.Message(&ev)
	if err != nil {
		return err
	}
	// Again while the audit stream fails over, within ctx (a minute when
	// it has no deadline): the id makes a repeat stored once.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	if err := kv.Retry(ctx, emitTry, func(ctx context.Context) error {
		_, err := e.js.PublishMsg(ctx, msg)
		return err
	}); err != nil {
		return fmt.Errorf("publish audit event %s: %w", ev.Type, err)
	}
	return nil
}

// emitTry bounds one try of Emit's publish.
const emitTry = 5 * time.Second

// Message stamps ev and returns it as a message for the audit stream, with
// the event id as Nats-Msg-Id, for a caller that publishes it without
// waiting (internal/asyncpub).
func (e *Emitter) Message(ev *wire.Event) (*nats.Msg, error) {
	e.Stamp(ev)
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode audit event %s: %w", ev.Type, err)
	}
	msg := nats.NewMsg(ev.Type.Subject())
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, ev.ID)
	return msg, nil
}

// Payload encodes v as an event payload, or returns nil if it cannot.
func Payload(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return b
}
