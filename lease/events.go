package lease

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
)

// events publishes the audit events of the lease and resource stores
// without waiting for each acknowledgement on the hot path. Every publish is
// checked later: a failed one is published again, synchronously, under the
// same Nats-Msg-Id (so the audit stream stores it once), and flush waits for
// all of them.
type events struct {
	em  *audit.Emitter
	js  jetstream.JetStream
	log *slog.Logger

	mu      sync.Mutex
	pending []jetstream.PubAckFuture
}

func newEvents(em *audit.Emitter, js jetstream.JetStream, log *slog.Logger) *events {
	return &events{em: em, js: js, log: log}
}

// emit publishes ev asynchronously.
func (e *events) emit(ev wire.Event) {
	f, err := e.em.EmitAsync(ev)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.em.Emit(ctx, ev); err != nil {
			e.log.Error("audit event lost", "type", ev.Type, "resource_id", ev.ResourceID, "err", err)
		}
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending = append(e.pending, f)
	e.reapLocked()
}

// reapLocked drops acknowledged publishes and republishes failed ones.
func (e *events) reapLocked() {
	keep := e.pending[:0]
	for _, f := range e.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			e.republish(f, err)
		default:
			keep = append(keep, f)
		}
	}
	clear(e.pending[len(keep):])
	e.pending = keep
}

func (e *events) republish(f jetstream.PubAckFuture, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, f.Msg()); err != nil {
		e.log.Error("audit event lost", "subject", f.Msg().Subject, "err", err, "first_err", cause)
	}
}

// flush waits until every event emitted so far is stored in the audit
// stream, or ctx ends.
func (e *events) flush(ctx context.Context) error {
	select {
	case <-e.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reapLocked()
	return nil
}

// eventID returns a ULID determined by t and parts, so that every process
// that records the same fact (an expiry, a move at a revision) publishes the
// same Nats-Msg-Id and the audit stream keeps one event.
func eventID(t time.Time, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return ulid.MustNew(ulid.Timestamp(t), bytes.NewReader(sum[:])).String()
}
