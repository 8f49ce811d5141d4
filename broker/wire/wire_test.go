package wire

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func golden(t *testing.T, name string, v any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatalf("marshal %s: %v", name, err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", name+".golden.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s encoding changed:\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

var t0 = time.Date(2026, 11, 30, 3, 12, 0, 123456789, time.UTC)

func TestGolden(t *testing.T) {
	t.Parallel()
	nb := t0.Add(time.Hour)
	until := t0.Add(30 * time.Second)
	affected, status := int64(1), int64(0)
	cases := map[string]any{
		"task": Task{
			ID: "task-1", Payload: json.RawMessage(`{"cmd":["echo","hi"]}`), Resource: "cam1",
			Priority: 5, MaxAttempts: 3, Timeout: "30s", NotBefore: &nb, Key: "k-1",
		},
		"task_empty": Task{},
		"task_info": TaskInfo{
			ID: "task-1", Type: "exec", Queue: "default", State: TaskRetryWait, Attempts: 2,
			LastError: "exit status 1", Resource: "cam1", CreatedAt: t0, UpdatedAt: t0,
		},
		"event": Event{
			ID: "01JDZ0000000000000000000AA", Time: t0, Type: EventTaskFinished, Level: LevelInfo,
			Component: "workers", Host: "plant-pc-1", TaskID: "task-1", ResourceID: "cam1",
			Message: "task finished", Payload: json.RawMessage(`{"attempts":1,"state":"SUCCEEDED"}`),
		},
		"lease":    Lease{Resource: "cam1", Owner: "worker-a", ExpiresAt: t0, Revision: 7},
		"resource": Resource{ID: "cam1", State: ResourceLeased, LeaseOwner: "worker-a", LeaseUntil: &until, RouteID: "office", UpdatedAt: t0},
		"waiter": Waiter{Resource: "cam1", Owner: "worker-a/task-1", TaskID: "task-1", Priority: 5, Arrived: &t0, Seq: 42,
			TTL: "5s", ExpiresAt: until},
		"route": Route{
			ID: "office", State: RouteCooldown, Score: 42.5, LatencyMS: 120, ConsecutiveFailures: 3,
			LastError: "timeout", CooldownUntil: &until, LastChecked: &t0,
		},
		"exec_payload": ExecPayload{Cmd: []string{"prog", "arg"}, Dir: "/tmp", Env: map[string]string{"A": "1"},
			Stdin: "in", FailExitCodes: []int{2}, DelayExitCodes: []int{75}},
		"http_payload": HTTPPayload{Method: "GET", URL: "http://127.0.0.1/", Headers: map[string]string{"Accept": "*/*"}, Route: "auto"},
		"sql_payload": SQLPayload{DB: "plant", Statement: "INSERT INTO readings (sensor, value) VALUES ($1, $2)",
			Args: json.RawMessage(`["t1",21.5]`), Out: []string{"total"}, Timeout: "30s", Tx: true, MaxRows: 10},
		"sql_result": SQLResult{RowsAffected: &affected, Columns: []string{"sensor", "value"}, Rows: [][]any{{"t1", 21.5}, {"t2", nil}},
			Truncated: true, Out: map[string]any{"total": 2}, ReturnStatus: &status},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, v)
		})
	}
}

func TestTaskSubject(t *testing.T) {
	t.Parallel()
	if got, want := TaskSubject("", "exec"), "gantry.tasks.default.exec"; got != want {
		t.Errorf("TaskSubject = %q, want %q", got, want)
	}
	if got, want := ReadySubject("urgent", "exec"), "gantry.ready.urgent.exec"; got != want {
		t.Errorf("ReadySubject = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		subject, queue, typ string
		ok                  bool
	}{
		{"gantry.tasks.default.exec", "default", "exec", true},
		{"gantry.tasks.q1.my-type", "q1", "my-type", true},
		{"gantry.tasks.default", "", "", false},
		{"gantry.tasks.a.b.c", "", "", false},
		{"gantry.ready.urgent.exec", "urgent", "exec", true},
		{"gantry.ready.urgent", "", "", false},
		{"gantry.audit.task.created", "", "", false},
	} {
		q, typ, err := ParseTaskSubject(tc.subject)
		if (err == nil) != tc.ok || q != tc.queue || typ != tc.typ {
			t.Errorf("ParseTaskSubject(%q) = %q, %q, %v; want %q, %q, ok=%v", tc.subject, q, typ, err, tc.queue, tc.typ, tc.ok)
		}
	}
}

func TestEventSubjects(t *testing.T) {
	t.Parallel()
	seen := map[string]EventType{}
	for _, typ := range EventTypes() {
		s := typ.Subject()
		if prev, dup := seen[s]; dup {
			t.Errorf("%s and %s share subject %s", typ, prev, s)
		}
		seen[s] = typ
	}
	for typ, want := range map[EventType]string{
		EventTaskFinished:    "gantry.audit.task.finished",
		EventResourceLeased:  "gantry.audit.resource.leased",
		EventRouteCooldown:   "gantry.audit.route.cooldown",
		EventType("WEIRD.X"): "gantry.audit.other.weird_x",
	} {
		if got := typ.Subject(); got != want {
			t.Errorf("%s.Subject() = %q, want %q", typ, got, want)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	in := json.RawMessage(`{"user":"bob","Password":"hunter2","nested":{"API_KEY":"k","list":[{"x-auth-Token":"t","ok":1}]},"headers":{"Authorization":"Bearer x","Cookie":"c"},"DB_Credentials":{"a":"b"}}`)
	got := RedactJSON(in)
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	want := `{"DB_Credentials":"[REDACTED]","Password":"[REDACTED]","headers":{"Authorization":"[REDACTED]","Cookie":"[REDACTED]"},"nested":{"API_KEY":"[REDACTED]","list":[{"ok":1,"x-auth-Token":"[REDACTED]"}]},"user":"bob"}`
	if string(got) != want {
		t.Errorf("RedactJSON = %s, want %s", got, want)
	}
	if got := RedactJSON(json.RawMessage(`not json`)); bytes.Contains(got, []byte("not json")) {
		t.Errorf("RedactJSON(invalid) = %s, want the text dropped", got)
	}
	if got := RedactJSON(json.RawMessage(`"plain"`)); string(got) != `"plain"` {
		t.Errorf("RedactJSON(string) = %s, want unchanged", got)
	}
}

func TestValidDriver(t *testing.T) {
	t.Parallel()
	for drv, want := range map[string]bool{
		DriverSQLite: true, DriverPostgres: true, DriverSQLServer: true, DriverMySQL: true,
		"": false, "oracle": false, "SQLite": false, "pgx": false,
	} {
		if got := ValidDriver(drv); got != want {
			t.Errorf("ValidDriver(%q) = %v, want %v", drv, got, want)
		}
	}
}
