package workers

import (
	"encoding/json"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// encodeEvent returns json.Marshal(ev), byte for byte, for a stamped event
// (Stamp leaves its payload valid JSON), without reflection: at three events
// per noop task, encoding/json's reflection, time marshaler and payload
// compaction took ~6 % of the CPU of BenchmarkRatio. An event with a string
// or payload that encoding/json would change (escapes, HTML characters,
// non-ASCII, spaces between tokens) or a time it refuses goes to
// json.Marshal.
func encodeEvent(ev *wire.Event) ([]byte, error) {
	strs := [...]string{ev.ID, string(ev.Type), string(ev.Level), ev.Component, ev.Host,
		ev.TaskID, ev.ResourceID, ev.RouteID, ev.JobID, ev.Message}
	simple := ev.Time.Year() >= 0 && ev.Time.Year() <= 9999 && compactPayload(ev.Payload)
	n := len(ev.Payload)
	for _, s := range strs {
		simple = simple && plainString(s)
		n += len(s)
	}
	if !simple {
		return json.Marshal(ev)
	}
	b := make([]byte, 0, n+200)
	b = append(b, `{"id":"`...)
	b = append(b, ev.ID...)
	b = append(b, `","time":"`...)
	b = ev.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","type":"`...)
	b = append(b, ev.Type...)
	b = append(b, `","level":"`...)
	b = append(b, ev.Level...)
	b = append(b, `","component":"`...)
	b = append(b, ev.Component...)
	b = append(b, `","host":"`...)
	b = append(b, ev.Host...)
	b = append(b, '"')
	b = appendOptional(b, `,"task_id":"`, ev.TaskID)
	b = appendOptional(b, `,"resource_id":"`, ev.ResourceID)
	b = appendOptional(b, `,"route_id":"`, ev.RouteID)
	b = appendOptional(b, `,"job_id":"`, ev.JobID)
	b = appendOptional(b, `,"message":"`, ev.Message)
	if len(ev.Payload) > 0 {
		b = append(b, `,"payload":`...)
		b = append(b, ev.Payload...)
	}
	return append(b, '}'), nil
}

// appendOptional appends key and the quoted s, an omitempty string field.
func appendOptional(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	b = append(b, key...)
	b = append(b, s...)
	return append(b, '"')
}

// plainString reports whether encoding/json writes s as it is between
// quotes: printable ASCII without '"', '\\', '<', '>' and '&'.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// compactPayload reports whether encoding/json writes the valid JSON p as
// it is: printable ASCII without '<', '>' and '&', and no space outside
// strings.
func compactPayload(p json.RawMessage) bool {
	inString, escaped := false, false
	for _, c := range p {
		switch {
		case c < 0x20 || c > 0x7e || c == '<' || c == '>' || c == '&':
			return false
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == ' ':
			return false
		}
	}
	return true
}
