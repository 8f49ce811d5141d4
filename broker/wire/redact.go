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

// IsSecretKey reports whether a map key looks like it holds a secret.
func IsSecretKey(key string) bool {
	k := strings.ToLower(key)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
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

// mayHoldSecret reports whether raw JSON might have a secret-looking key:
// whether any secret word occurs anywhere in it (in any case), or a \u
// escape could spell one. When it reports false, no key can be secret and
// RedactJSON skips decoding.
func mayHoldSecret(raw []byte) bool {
	if bytes.Contains(raw, []byte(`\u`)) {
		return true
	}
	lower := bytes.ToLower(raw)
	for _, w := range secretWords {
		if bytes.Contains(lower, []byte(w)) {
			return true
		}
	}
	return false
}

// RedactEvent redacts ev's payload in place and returns ev.
func RedactEvent(ev *Event) *Event {
	ev.Payload = RedactJSON(ev.Payload)
	return ev
}

// secretPair matches a key that looks like a secret, assigned a value in
// text: key=value, key: value, "key": "value" (the key quoted or not, the
// value quoted, a "Bearer x" credential, or a bare word).
var secretPair = regexp.MustCompile(`(?i)(["']?[A-Za-z0-9_.\-]*(?:` + strings.Join(quoteAll(secretWords), "|") +
	`)[A-Za-z0-9_.\-]*["']?\s*[:=]\s*)("(?:[^"\\]|\\.)*"|'[^']*'|(?:bearer|basic|token)\s+[^\s,;&"'}]+|[^\s,;&"'}]+)`)

func quoteAll(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = regexp.QuoteMeta(w)
	}
	return out
}

// RedactLine returns a line of text output (a task's stdout, a handler's
// reply) with the value of every secret-looking key redacted, as events
// are: a JSON document as RedactJSON does it, and in any other text each
// key=value, key: value or "key": "value" pair whose key looks like a
// secret ("DB_PASSWORD=x", "Authorization: Bearer x"). A line with no
// secret word in it is returned as is, without further work.
func RedactLine(line string) string {
	if !mayHoldSecret([]byte(line)) {
		return line
	}
	if t := strings.TrimSpace(line); len(t) > 1 && (t[0] == '{' || t[0] == '[') && json.Valid([]byte(t)) {
		return string(RedactJSON(json.RawMessage(t)))
	}
	return secretPair.ReplaceAllStringFunc(line, func(m string) string {
		sm := secretPair.FindStringSubmatch(m)
		switch v := sm[2]; {
		case strings.HasPrefix(v, `"`):
			return sm[1] + `"` + Redacted + `"`
		case strings.HasPrefix(v, "'"):
			return sm[1] + "'" + Redacted + "'"
		}
		return sm[1] + Redacted
	})
}
