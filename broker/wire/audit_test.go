package wire

import (
	"encoding/json"
	"testing"
	"time"
)

func TestAuditGolden(t *testing.T) {
	t.Parallel()
	until := t0.Add(time.Hour)
	cases := map[string]any{
		"audit_query": AuditQuery{
			TaskID: "task-1", ResourceID: "cam1", RouteID: "office", JobID: "tick", Type: EventTaskFinished,
			Level: LevelWarn, Since: &t0, Until: &until, Limit: 50, Cursor: "mOzYq-W6oxwwMU04",
		},
		"audit_query_empty": AuditQuery{},
		"audit_page": AuditPage{
			Events: []Event{{ID: "01JDZ0000000000000000000AA", Time: t0, Type: EventLeaseConflict, Level: LevelWarn,
				Component: "workers", Host: "plant-pc-1", TaskID: "task-1", ResourceID: "cam1", Message: "cam1 is held by worker-b"}},
			Cursor: "mOzYq-W6oxwwMU04",
		},
		"audit_backup_reply": AuditBackupReply{Name: "01JDZ0000000000000000000AB", Time: t0, Files: []AuditBackupFile{
			{Path: "000002.log", Size: 22623, SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
		}},
		"audit_stats": AuditStats{Stored: 1200, Malformed: 2, WriteErrors: 1, Expired: 40, Retention: "720h0m0s"},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, v)
		})
	}
}

func TestRedactNestedAndMixedCase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"top level, mixed case",
			`{"PassWord":"a","user":"bob","X-Api-Key":"k","Set-Cookie":"c","AUTHORIZATION":"Bearer x"}`,
			`{"AUTHORIZATION":"[REDACTED]","PassWord":"[REDACTED]","Set-Cookie":"[REDACTED]","X-Api-Key":"[REDACTED]","user":"bob"}`},
		{"nested maps and arrays",
			`{"env":{"DB_PASSWORD":"p","PATH":"/bin"},"steps":[{"headers":{"Authorization":"x","Accept":"*/*"}},[{"client_secret":"s"}]]}`,
			`{"env":{"DB_PASSWORD":"[REDACTED]","PATH":"/bin"},"steps":[{"headers":{"Accept":"*/*","Authorization":"[REDACTED]"}},[{"client_secret":"[REDACTED]"}]]}`},
		{"a secret key holding an object is redacted whole",
			`{"credentials":{"user":"u","pass":"p"},"ok":1}`,
			`{"credentials":"[REDACTED]","ok":1}`},
		{"escaped key", `{"pass\u0077ord":"p"}`, `{"password":"[REDACTED]"}`},
		{"more words", `{"ssh":{"Passphrase":"p","Private_Key":"k"}}`, `{"ssh":{"Passphrase":"[REDACTED]","Private_Key":"[REDACTED]"}}`},
		{"short words as whole segments",
			`{"auth":"a","DB_PASS":"p","pwd":"w","session_id":"s","X-Auth-User":"u","author":"bob","bypass":1,"passed":2}`,
			`{"DB_PASS":"[REDACTED]","X-Auth-User":"[REDACTED]","auth":"[REDACTED]","author":"bob","bypass":1,"passed":2,"pwd":"[REDACTED]","session_id":"[REDACTED]"}`},
		{"no secret: kept as is", `{"state":"SUCCEEDED","attempts":2}`, `{"state":"SUCCEEDED","attempts":2}`},
		{"secret word only in a value: kept", `{"note":"rotate the token"}`, `{"note":"rotate the token"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := string(RedactJSON(json.RawMessage(tc.in))); got != tc.want {
				t.Errorf("RedactJSON(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
	if got := string(RedactJSON(json.RawMessage(`{"state":`))); got != `"[UNPARSEABLE PAYLOAD DROPPED]"` {
		t.Errorf("RedactJSON(truncated) = %s, want it dropped", got)
	}
}
