package kv

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/gantry-dev/gantry/broker/wire"
)

// ErrBadValue marks a value a store read but cannot use: not the JSON it
// should be, or written without what every writer of the bucket gives it
// (a lease without the broker's TTL). Any client can write any bytes into
// a bucket: a component that meets one quarantines it (a VALUE_QUARANTINED
// event, see BadValueError.Event), skips or replaces it, and carries on.
var ErrBadValue = errors.New("bad value")

// BadValueError is a bad value: where it is and why it is bad. It matches
// ErrBadValue.
type BadValueError struct {
	Bucket   string
	Key      string
	Revision uint64
	// Reason says what is wrong with it.
	Reason string
}

// BadValue returns the error of the value of key at rev in bucket, bad
// because of why.
func BadValue(bucket, key string, rev uint64, why error) *BadValueError {
	return &BadValueError{Bucket: bucket, Key: key, Revision: rev, Reason: why.Error()}
}

// Error names the bucket, key, revision and reason.
func (e *BadValueError) Error() string {
	return fmt.Sprintf("bad value of %s in %s (revision %d): %s", e.Key, e.Bucket, e.Revision, e.Reason)
}

// Is makes errors.Is(err, ErrBadValue) true.
func (e *BadValueError) Is(target error) bool { return target == ErrBadValue }

// Event returns the VALUE_QUARANTINED event that records e and action,
// what the component did with the value ("skipped", "deleted", ...).
func (e *BadValueError) Event(action string) wire.Event {
	payload, _ := json.Marshal(map[string]any{"bucket": e.Bucket, "key": e.Key, "revision": e.Revision, "reason": e.Reason, "action": action})
	ev := wire.Event{
		Type: wire.EventValueQuarantined, Level: wire.LevelWarn,
		Message: fmt.Sprintf("%s: %s", e.Error(), action),
		Payload: payload,
	}
	// The key of these buckets names what the event is about, so that
	// `gantry audit query --resource cam1` finds it.
	switch e.Bucket {
	case wire.BucketLeases, wire.BucketResources:
		ev.ResourceID = e.Key
	case wire.BucketRoutes:
		ev.RouteID = e.Key
	case wire.BucketJobs:
		ev.JobID = e.Key
	case wire.BucketTasks:
		ev.TaskID = e.Key
	}
	return ev
}

// Quarantine reports the bad values a component meets, each once per
// revision however often it reads it (a periodic scan), through report.
// It is safe for concurrent use; a nil Quarantine reports nothing.
type Quarantine struct {
	report func(wire.Event)

	mu   sync.Mutex
	seen map[string]uint64
}

// NewQuarantine returns a Quarantine that hands each VALUE_QUARANTINED
// event to report (which publishes it).
func NewQuarantine(report func(wire.Event)) *Quarantine {
	return &Quarantine{report: report, seen: map[string]uint64{}}
}

// Report records err as quarantined with action, if err is a
// *BadValueError not reported before at its revision. It returns whether
// err is a bad value at all.
func (q *Quarantine) Report(err error, action string) bool {
	var bad *BadValueError
	if !errors.As(err, &bad) {
		return false
	}
	if q == nil {
		return true
	}
	k := bad.Bucket + "\x00" + bad.Key
	q.mu.Lock()
	first := q.seen[k] != bad.Revision
	q.seen[k] = bad.Revision
	q.mu.Unlock()
	if first {
		q.report(bad.Event(action))
	}
	return true
}
