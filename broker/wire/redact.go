package wire

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
)

// Redacted replaces the value of every key that looks like a secret.
const Redacted = "[REDACTED]"

// secretWords are the fragments that make a key look like a secret, matched
// case-insensitively anywhere in the key ("DB_PASSWORD", "X-Api-Key").
var secretWords = []string{
	"password", "passwd", "token", "secret", "authorization",
	"cookie", "api_key", "apikey", "api-key", "credential",
	"passphrase", "private_key", "privatekey",
}

// secretSegments are the short words that make a key look like a secret
// when they are one whole segment of it, between '_', '-', '.' or a change
// of case ("DB_PASS", "X-Auth", "sessionId", "pwd"), but not inside a longer
// word ("passed", "author", "sessions").
var secretSegments = []string{"pass", "pwd", "pw", "auth", "session"}

// IsSecretKey reports whether a map key looks like it holds a secret.
func IsSecretKey(key string) bool {
	k := strings.ToLower(key)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	for _, seg := range keySegments(key) {
		for _, w := range secretSegments {
			if strings.EqualFold(seg, w) {
				return true
			}
		}
	}
	return false
}

// keySegments splits key at '_', '-', '.' and where a lower-case letter or
// a digit is followed by an upper-case one.
func keySegments(key string) []string {
	var out []string
	start := 0
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '_' || c == '-' || c == '.' || c == ' ':
			if i > start {
				out = append(out, key[start:i])
			}
			start = i + 1
		case c >= 'A' && c <= 'Z' && i > start && (key[i-1] >= 'a' && key[i-1] <= 'z' || key[i-1] >= '0' && key[i-1] <= '9'):
			out = append(out, key[start:i])
			start = i
		}
	}
	if start < len(key) {
		out = append(out, key[start:])
	}
	return out
}

// Redact returns v with the value of every secret-looking key, at any depth
// of maps and slices, replaced by Redacted. v is not modified.
func Redact(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			if IsSecretKey(k) {
				out[k] = Redacted
				continue
			}
			out[k] = Redact(val)
		}
		return out
	case map[string]string:
		out := make(map[string]any, len(x))
		for k, val := range x {
			if IsSecretKey(k) {
				out[k] = Redacted
				continue
			}
			out[k] = val
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = Redact(val)
		}
		return out
	default:
		return v
	}
}

// RedactJSON returns raw with every secret-looking key's value redacted. A
// document that is not JSON is returned as a JSON string saying so, never
// as is, since it cannot be inspected for secrets.
func RedactJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	if json.Valid(raw) && !mayHoldSecret(raw) {
		return raw
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return json.RawMessage(`"[UNPARSEABLE PAYLOAD DROPPED]"`)
	}
	switch v.(type) {
	case map[string]any, []any:
	default:
		return raw
	}
	out, err := json.Marshal(Redact(v))
	if err != nil {
		return json.RawMessage(`"[UNPARSEABLE PAYLOAD DROPPED]"`)
	}
	return out
}

// mayHoldSecret reports whether raw text might have a secret-looking key:
// whether any secret word or segment occurs anywhere in it (in any case),
// or a \u escape could spell one. When it reports false, no key can be
// secret and the redactors skip their work.
func mayHoldSecret(raw []byte) bool {
	if bytes.Contains(raw, []byte(`\u`)) {
		return true
	}
	for _, w := range secretWords {
		if containsFold(raw, w) {
			return true
		}
	}
	for _, w := range secretSegments {
		if containsFold(raw, w) {
			return true
		}
	}
	return false
}

// containsFold reports whether s holds word (lower-case ASCII) in any case,
// without allocating.
func containsFold(s []byte, word string) bool {
	n := len(word)
	for i := 0; i+n <= len(s); i++ {
		j := 0
		for ; j < n; j++ {
			c := s[i+j]
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != word[j] {
				break
			}
		}
		if j == n {
			return true
		}
	}
	return false
}

// RedactEvent redacts ev's payload (RedactJSON) and message (RedactLine)
// in place and returns ev.
func RedactEvent(ev *Event) *Event {
	ev.Payload = RedactJSON(ev.Payload)
	ev.Message = RedactLine(ev.Message)
	return ev
}

// keyValue matches a key assigned a value in text: key=value, key: value,
// "key": "value" (the key quoted or not, the value quoted, a "Bearer x"
// credential, or a bare word). RedactLine redacts the value when the key
// looks like a secret (IsSecretKey).
var keyValue = regexp.MustCompile(`(?i)(["']?)([A-Za-z0-9_.\-]+)(["']?\s*[:=]\s*)("(?:[^"\\]|\\.)*"|'[^']*'|(?:bearer|basic|token)\s+[^\s,;&"'}]+|[^\s,;&"'}]+)`)

// RedactLine returns a line of text (a task's output, an error message, an
// event's message) with the value of every secret-looking key redacted, as
// events are: a JSON document as RedactJSON does it, and in any other text
// each key=value, key: value or "key": "value" pair whose key looks like a
// secret ("DB_PASSWORD=x", "pw=x", "Authorization: Bearer x"). A line with
// no secret word in it is returned as is, without further work.
func RedactLine(line string) string {
	if !mayHoldSecret([]byte(line)) {
		return line
	}
	if t := strings.TrimSpace(line); len(t) > 1 && (t[0] == '{' || t[0] == '[') && json.Valid([]byte(t)) {
		return string(RedactJSON(json.RawMessage(t)))
	}
	// A pair whose key is not secret may hold one in its value ("failed:
	// pw=x"): the search goes on from the value, not past it.
	var b strings.Builder
	pos := 0
	for pos < len(line) {
		m := keyValue.FindStringSubmatchIndex(line[pos:])
		if m == nil {
			break
		}
		key, value := line[pos+m[4]:pos+m[5]], line[pos+m[8]:pos+m[9]]
		if !IsSecretKey(key) {
			b.WriteString(line[pos : pos+m[8]])
			pos += m[8]
			continue
		}
		b.WriteString(line[pos : pos+m[8]])
		switch {
		case strings.HasPrefix(value, `"`):
			b.WriteString(`"` + Redacted + `"`)
		case strings.HasPrefix(value, "'"):
			b.WriteString("'" + Redacted + "'")
		default:
			b.WriteString(Redacted)
		}
		pos += m[9]
	}
	b.WriteString(line[pos:])
	return b.String()
}
