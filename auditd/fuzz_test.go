package auditd

import (
	"slices"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// FuzzDecodeEvent feeds any bytes, as any client can publish on the audit
// stream, to the event decoder (docs/RELIABILITY.md, "Fuzzing"): it is
// refused, or it is an event the store takes and a query finds again.
func FuzzDecodeEvent(f *testing.F) {
	for _, seed := range []string{
		`{"id":"e1","time":"2026-12-01T00:00:00Z","type":"TASK_CREATED","task_id":"t1","level":"INFO"}`,
		`{"id":"e2","time":"2026-12-01T00:00:00Z","type":"LEASE_CONFLICT","payload":{"password":"x","count":3}}`,
		`{"id":"e3","time":"1600-01-01T00:00:00Z","type":"X"}`,
		`{"id":"e\u0000","time":"2026-12-01T00:00:00Z","type":"X"}`,
		`{"id":"e4","time":"2026-12-01T00:00:00Z","type":"X","payload":"not an object"}`,
		`[]`, `{"time":1}`,
	} {
		f.Add([]byte(seed))
	}
	s, err := OpenStore(f.TempDir(), StoreOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := parseEvent(data)
		if err != nil {
			return // auditd stores an AUDIT_MALFORMED record instead
		}
		if _, err := s.Write([]wire.Event{ev}); err != nil {
			t.Fatalf("Write of %s = %v", data, err)
		}
		since, until := ev.Time.Add(-time.Second), ev.Time.Add(time.Second)
		page, err := s.Query(wire.AuditQuery{Type: ev.Type, Since: &since, Until: &until, Limit: 1000})
		if err != nil {
			t.Fatalf("Query after %s = %v", data, err)
		}
		if !slices.ContainsFunc(page.Events, func(got wire.Event) bool { return got.ID == ev.ID }) {
			t.Fatalf("event %q written from %s is not found by its type and time", ev.ID, data)
		}
	})
}
