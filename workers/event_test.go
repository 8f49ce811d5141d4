package workers

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
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
		ev := wire.Event{ID: "01KB0000000000000000000000", Time: time.Unix(0, ns).In(time.FixedZone("X", 3600)),
			Type: wire.EventTaskStarted, Level: wire.LevelInfo, Component: "workers", Host: host,
			TaskID: "t-1", ResourceID: host, Message: message, Payload: json.RawMessage(payload)}
		if !json.Valid(ev.Payload) {
			ev.Payload = nil
		}
		want, wantErr := json.Marshal(&ev)
		got, err := encodeEvent(&ev)
		if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
			t.Errorf("encodeEvent = %s, %v; want %s, %v", got, err, want, wantErr)
		}
	})
}
