package lease

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/asyncpub"
	"github.com/gantry-dev/gantry/internal/audit"
)

// events publishes the audit events of the lease and resource stores
// without waiting for each acknowledgement on the hot path. Every publish is
// checked later: a failed one is published again, synchronously, under the
// same Nats-Msg-Id (so the audit stream stores it once), and flush waits for
// all of them (internal/asyncpub).
type events struct {
	em  *audit.Emitter
	pub *asyncpub.Publisher
	log *slog.Logger
}

func newEvents(em *audit.Emitter, js jetstream.JetStream, log *slog.Logger) (*events, error) {
	pub, err := asyncpub.New(js.Conn(), asyncpub.Config{Timeout: 5 * time.Second, Logger: log})
	if err != nil {
		return nil, err
	}
	return &events{em: em, pub: pub, log: log}, nil
}

// emit publishes ev asynchronously.
func (e *events) emit(ev wire.Event) {
	m, err := e.em.Message(&ev)
	if err != nil {
		e.log.Error("audit event lost", "type", ev.Type, "resource_id", ev.ResourceID, "err", err)
		return
	}
	e.pub.Publish(m, "")
}

// flush waits until every event emitted so far is stored in the audit
// stream, or ctx ends.
func (e *events) flush(ctx context.Context) error { return e.pub.Flush(ctx) }

// eventID returns a ULID determined by t and parts, so that every process
// that records the same fact (an expiry, a move at a revision) publishes the
// same Nats-Msg-Id and the audit stream keeps one event.
func eventID(t time.Time, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return ulid.MustNew(ulid.Timestamp(t), bytes.NewReader(sum[:])).String()
}
