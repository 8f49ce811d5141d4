package wire

import (
	"bytes"
	"encoding/json"
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
