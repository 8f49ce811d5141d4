package wire

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func FuzzEncodeEvent(f *testing.F) {
	for _, s := range [][3]string{
		{"task started", "host-1", `{"attempt":1,"type":"noop","worker":"w-1"}`},
		{"", "", ""},
		{"a <b> & \"c\" \\ d", "höst", `{"a": 1}`},
		{"tab\there", "line\nbreak", `{"html":"<&>"}`},
		{"\u2028", "x", `{"s":"\u2028 \"q\" \\"}`},
		{"x", "y", `"[UNPARSEABLE PAYLOAD DROPPED]"`},
		{"x", "y", `[1, 2]`},
	} {
		f.Add(s[0], s[1], s[2], int64(1764515075123456789))
	}
	f.Fuzz(func(t *testing.T, message, host, payload string, ns int64) {
		ev := Event{ID: "01KB0000000000000000000000", Time: time.Unix(0, ns).In(time.FixedZone("X", 3600)),
			Type: EventTaskStarted, Level: LevelInfo, Component: "workers", Host: host,
			TaskID: "t-1", ResourceID: host, Message: message, Payload: json.RawMessage(payload)}
		if !json.Valid(ev.Payload) {
			ev.Payload = nil
		}
		want, wantErr := json.Marshal(&ev)
		got, err := EncodeEvent(&ev)
		if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
			t.Errorf("EncodeEvent = %s, %v; want %s, %v", got, err, want, wantErr)
		}
	})
}

// FuzzEncodeTaskRecord checks that a record is encoded as json.Marshal
// encodes it.
func FuzzEncodeTaskRecord(f *testing.F) {
	for _, s := range [][3]string{
		{"SUCCEEDED", "", "w-1"},
		{"NEEDS_REVIEW", "exit status 1: <no such file> & \"quoted\"", "höst-1"},
		{"RETRY_WAIT", "line\nbreak\ttab", ""},
	} {
		f.Add(s[0], s[1], s[2], int64(1764515075123456789), 3, uint64(42), true)
	}
	f.Fuzz(func(t *testing.T, state, lastError, worker string, ns int64, n int, seq uint64, times bool) {
		at := time.Unix(0, ns).In(time.FixedZone("X", -7200))
		r := TaskRecord{TaskInfo: TaskInfo{ID: "t-1", Type: "noop", Queue: "default", State: TaskState(state),
			Attempts: n, LastError: lastError, Resource: worker, CreatedAt: at, UpdatedAt: at.UTC()},
			Deliveries: n, Delays: -n, MaxAttempts: n, Priority: n, Key: lastError, Seq: seq, Worker: worker, Output: lastError, Run: n}
		if times {
			r.NotBefore, r.RetryAt = &at, &r.UpdatedAt
		}
		want, wantErr := json.Marshal(r)
		got, err := EncodeTaskRecord(&r)
		if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
			t.Errorf("EncodeTaskRecord = %s, %v; want %s, %v", got, err, want, wantErr)
		}
	})
}
