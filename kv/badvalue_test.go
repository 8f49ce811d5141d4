package kv

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
)

func TestCheckTTL(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{
		"": false, "30s": true, "30": true, "1h": true, "2h": false, "never": false, "0": false, "-5s": false,
		"99999999999999999": false, "x": false,
	} {
		h := nats.Header{}
		if v != "" {
			h.Set(jetstream.MsgTTLHeader, v)
		}
		if err := CheckTTL(h, time.Hour); (err == nil) != ok {
			t.Errorf("CheckTTL(%q) = %v, want ok %v", v, err, ok)
		}
	}
}

func TestQuarantineReportsOncePerRevision(t *testing.T) {
	t.Parallel()
	var got []wire.Event
	q := NewQuarantine(func(ev wire.Event) { got = append(got, ev) })
	bad := BadValue(wire.BucketResources, "cam1", 7, errors.New("not JSON"))
	for range 3 {
		if !q.Report(bad, "skipped") {
			t.Fatal("Report(bad value) = false, want true")
		}
	}
	q.Report(BadValue(wire.BucketResources, "cam1", 9, errors.New("not JSON")), "skipped")
	if q.Report(errors.New("other"), "skipped") {
		t.Error("Report(not a bad value) = true, want false")
	}
	if len(got) != 2 || got[0].Type != wire.EventValueQuarantined || got[0].ResourceID != "cam1" {
		t.Errorf("events = %+v, want two VALUE_QUARANTINED about cam1 (revisions 7 and 9)", got)
	}
	var none *Quarantine
	if !none.Report(bad, "skipped") || !errors.Is(bad, ErrBadValue) {
		t.Error("a nil Quarantine must still tell a bad value, and BadValueError match ErrBadValue")
	}
}
