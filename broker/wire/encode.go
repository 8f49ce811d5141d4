package wire

import (
	"encoding/json"
	"strconv"
	"time"
)

// Fast JSON encoders for the two messages written per task on the hot path.
// Each produces exactly what json.Marshal does (fuzz tests compare them) and
// falls back to json.Marshal for anything it would not write byte for byte.

// EncodeEvent returns json.Marshal(ev), byte for byte, for an event whose
// payload is valid JSON (internal/audit's Stamp sees to that), without
// reflection: at three events per noop task, encoding/json's reflection,
// time marshaler and payload compaction took ~6 % of the workers' CPU in
// their BenchmarkRatio. An event with a string
// or payload that encoding/json would change (escapes, HTML characters,
// non-ASCII, spaces between tokens) or a time it refuses goes to
// json.Marshal.
func EncodeEvent(ev *Event) ([]byte, error) {
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
	b = appendString(b, `,"task_id":"`, ev.TaskID)
	b = appendString(b, `,"resource_id":"`, ev.ResourceID)
	b = appendString(b, `,"route_id":"`, ev.RouteID)
	b = appendString(b, `,"job_id":"`, ev.JobID)
	b = appendString(b, `,"message":"`, ev.Message)
	if len(ev.Payload) > 0 {
		b = append(b, `,"payload":`...)
		b = append(b, ev.Payload...)
	}
	return append(b, '}'), nil
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

// EncodeTaskRecord returns json.Marshal(r), byte for byte, without
// reflection where it can.
func EncodeTaskRecord(r *TaskRecord) ([]byte, error) {
	if data, ok := appendTaskRecord(nil, r); ok {
		return data, nil
	}
	return json.Marshal(r)
}

// appendTaskRecord appends json.Marshal(r), byte for byte, without reflection:
// a worker writes a record per task, and encoding/json took ~3 % of the
// CPU of the workers' BenchmarkRatio. It reports false, having appended
// nothing, for a record it leaves to json.Marshal: one with a stored
// message, a time json.Marshal refuses, or a string encoding/json would
// change (escapes, HTML characters, non-ASCII).
func appendTaskRecord(b []byte, r *TaskRecord) ([]byte, bool) {
	if r.Message != nil || !jsonTime(r.CreatedAt) || !jsonTime(r.UpdatedAt) ||
		(r.NotBefore != nil && !jsonTime(*r.NotBefore)) || (r.RetryAt != nil && !jsonTime(*r.RetryAt)) {
		return b, false
	}
	for _, s := range [...]string{r.ID, r.Type, r.Queue, string(r.State), r.LastError, r.Resource, r.Key, r.Worker, r.Output} {
		if !plainString(s) {
			return b, false
		}
	}
	b = append(b, `{"id":"`...)
	b = append(b, r.ID...)
	b = append(b, `","type":"`...)
	b = append(b, r.Type...)
	b = append(b, `","queue":"`...)
	b = append(b, r.Queue...)
	b = append(b, `","state":"`...)
	b = append(b, r.State...)
	b = append(b, `","attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	b = appendString(b, `,"last_error":"`, r.LastError)
	b = appendString(b, `,"resource":"`, r.Resource)
	b = append(b, `,"created_at":"`...)
	b = r.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","updated_at":"`...)
	b = r.UpdatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	b = appendInt(b, `,"deliveries":`, r.Deliveries)
	b = appendInt(b, `,"delays":`, r.Delays)
	b = appendInt(b, `,"max_attempts":`, r.MaxAttempts)
	b = appendInt(b, `,"priority":`, r.Priority)
	b = appendString(b, `,"key":"`, r.Key)
	b = appendTime(b, `,"not_before":"`, r.NotBefore)
	b = appendTime(b, `,"retry_at":"`, r.RetryAt)
	if r.Seq != 0 {
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, r.Seq, 10)
	}
	b = appendString(b, `,"worker":"`, r.Worker)
	b = appendString(b, `,"output":"`, r.Output)
	b = appendInt(b, `,"run":`, r.Run)
	return append(b, '}'), true
}

// appendString appends key and the quoted s, an omitempty string field.
func appendString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	b = append(b, key...)
	b = append(b, s...)
	return append(b, '"')
}

// appendInt appends key and n, an omitempty int field.
func appendInt(b []byte, key string, n int) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), int64(n), 10)
}

// appendTime appends key and the quoted *t, an omitempty time pointer.
func appendTime(b []byte, key string, t *time.Time) []byte {
	if t == nil {
		return b
	}
	b = t.AppendFormat(append(b, key...), time.RFC3339Nano)
	return append(b, '"')
}

// jsonTime reports whether json.Marshal accepts t (its year in 0-9999).
func jsonTime(t time.Time) bool { return t.Year() >= 0 && t.Year() <= 9999 }
