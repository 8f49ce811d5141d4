package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/pgtest"
	"github.com/gantry-dev/gantry/sqltask"
)

// sqlTask is the body of a sql task.
func sqlTask(t *testing.T, id string, p wire.SQLPayload, extra string) string {
	t.Helper()
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"id":%q,"payload":%s%s}`, id, data, extra)
}

const sqlSubject = "gantry.tasks.default.sql"

func TestSQLTaskSQLite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := filepath.Join(t.TempDir(), "plant.db")
	b.start(t, Config{Policy: fastPolicy, Databases: []sqltask.Database{{Name: "plant", Driver: sqltask.SQLite, DSN: "file:" + path}}}, nil)

	b.publish(t, sqlSubject, sqlTask(t, "create", wire.SQLPayload{DB: "plant", Statement: "CREATE TABLE readings (sensor TEXT, value REAL)"}, ""))
	b.waitState(t, "create", wire.TaskSucceeded, 10*time.Second)
	b.publish(t, sqlSubject, sqlTask(t, "insert", wire.SQLPayload{DB: "plant",
		Statement: "INSERT INTO readings VALUES (?, ?), (?, ?)", Args: json.RawMessage(`["t1", 1.5, "t2", 2]`)}, ""))
	rec := b.waitState(t, "insert", wire.TaskSucceeded, 10*time.Second)
	if got, want := string(rec.Result), `{"rows_affected":2}`; got != want {
		t.Errorf("insert result on the record = %s, want %s", got, want)
	}
	b.publish(t, sqlSubject, sqlTask(t, "select", wire.SQLPayload{DB: "plant", Statement: "SELECT sensor, value FROM readings ORDER BY sensor"}, ""))
	rec = b.waitState(t, "select", wire.TaskSucceeded, 10*time.Second)
	want := `{"columns":["sensor","value"],"rows":[["t1",1.5],["t2",2]]}`
	if got := string(rec.Result); got != want {
		t.Errorf("select result on the record = %s, want %s", got, want)
	}
	// TASK_FINISHED carries the result too.
	ev := b.waitEvents(t, "select", wire.EventTaskFinished, 1, 5*time.Second)[0]
	if got, _ := json.Marshal(payload(t, ev)["result"]); string(got) != want {
		t.Errorf("TASK_FINISHED result = %s, want %s", got, want)
	}

	// A database the worker does not have, and a bad payload: permanent.
	b.publish(t, sqlSubject, sqlTask(t, "nodb", wire.SQLPayload{DB: "nope", Statement: "SELECT 1"}, ""))
	rec = b.waitState(t, "nodb", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, `db "nope" is not among`) {
		t.Errorf("unknown db = attempts %d, %q; want NEEDS_REVIEW after 1 attempt naming the db", rec.Attempts, rec.LastError)
	}
	b.publish(t, sqlSubject, `{"id":"badpayload","payload":{"db":"plant","statement":"SELECT 1","rows":5}}`)
	rec = b.waitState(t, "badpayload", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, `unknown field "rows"`) {
		t.Errorf("bad payload = attempts %d, %q; want NEEDS_REVIEW after 1 attempt naming the field", rec.Attempts, rec.LastError)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pgWorkers starts workers with a fresh PostgreSQL database as "pg", logging
// into the returned buffer (and t.Log), and returns the database's DSN.
func pgWorkers(t *testing.T, b *bundle, extra ...sqltask.Database) (string, *syncBuffer) {
	t.Helper()
	srv := pg.Get(t)
	dsn := srv.NewDatabase(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dbs := append([]sqltask.Database{{Name: "pg", Driver: sqltask.Postgres, DSN: dsn}}, extra...)
	b.start(t, Config{Policy: fastPolicy, Databases: dbs, Logger: log}, nil)
	return dsn, logs
}

// waitPg polls the server until f holds of the backends running marker.
func waitPg(t *testing.T, dsn, marker, what string, f func([]pgtest.Backend) bool) {
	t.Helper()
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if running := pg.Get(t).Running(t, dsn, marker); !f(running) {
			return fmt.Errorf("pg_stat_activity shows %v running %q, want %s", running, marker, what)
		}
		return nil
	})
}

func none(b []pgtest.Backend) bool { return len(b) == 0 }

func TestSQLTaskPostgres(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dsn, _ := pgWorkers(t, b)
	pg.Get(t).Exec(t, dsn, `CREATE TABLE readings (id serial PRIMARY KEY, sensor text NOT NULL, value double precision)`)

	// Insert with bound args; the result is on the record.
	b.publish(t, sqlSubject, sqlTask(t, "insert", wire.SQLPayload{DB: "pg",
		Statement: "INSERT INTO readings (sensor, value) VALUES ($1, $2) RETURNING id", Args: json.RawMessage(`["t1", 20.5]`)}, ""))
	rec := b.waitState(t, "insert", wire.TaskSucceeded, 10*time.Second)
	if got, want := string(rec.Result), `{"columns":["id"],"rows":[[1]]}`; got != want {
		t.Errorf("insert returning = %s, want %s", got, want)
	}

	// A syntax error goes to NEEDS_REVIEW after one attempt.
	b.publish(t, sqlSubject, sqlTask(t, "syntax", wire.SQLPayload{DB: "pg", Statement: "SELEC * FROM readings"}, ""))
	rec = b.waitState(t, "syntax", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "SQLSTATE 42601") {
		t.Errorf("syntax error = attempts %d, %q; want NEEDS_REVIEW after 1 attempt with SQLSTATE 42601", rec.Attempts, rec.LastError)
	}
}

// TestSQLTaskTimeoutAndCancelOnServer checks that a task's timeout, and a
// cancel, stop the statement on the server, not just the wait for it.
func TestSQLTaskTimeoutAndCancelOnServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dsn, _ := pgWorkers(t, b)

	b.publish(t, sqlSubject, sqlTask(t, "slow", wire.SQLPayload{DB: "pg", Statement: "SELECT pg_sleep(60) /* task-timeout */"},
		`,"timeout":"1s","max_attempts":1`))
	waitPg(t, dsn, "task-timeout", "it running", func(r []pgtest.Backend) bool { return len(r) == 1 })
	rec := b.waitState(t, "slow", wire.TaskNeedsReview, 10*time.Second)
	if !strings.Contains(rec.LastError, "timed out after 1s") || !strings.Contains(rec.LastError, "57014") {
		t.Errorf("last error = %q, want a timeout with query_canceled (57014)", rec.LastError)
	}
	waitPg(t, dsn, "task-timeout", "none: cancelled on the server", none)

	b.publish(t, sqlSubject, sqlTask(t, "doomed", wire.SQLPayload{DB: "pg", Statement: "SELECT pg_sleep(60) /* task-cancel */"}, ""))
	waitPg(t, dsn, "task-cancel", "it running", func(r []pgtest.Backend) bool { return len(r) == 1 })
	if _, err := askCancel(b, "doomed", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	b.waitState(t, "doomed", wire.TaskCancelled, 10*time.Second)
	waitPg(t, dsn, "task-cancel", "none: cancelled on the server", none)
}

// TestSQLTaskDeadlockRetries forces a deadlock between a sql task and
// another session: the task is the victim (40P01), is retried, and then
// succeeds.
func TestSQLTaskDeadlockRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dsn, _ := pgWorkers(t, b)
	srv := pg.Get(t)
	srv.Exec(t, dsn, `CREATE TABLE pair (id int PRIMARY KEY, v int NOT NULL)`, `INSERT INTO pair VALUES (1, 0), (2, 0)`, `
CREATE FUNCTION lock_both() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
	UPDATE pair SET v = v + 1 WHERE id = 1;
	PERFORM pg_sleep(1);
	UPDATE pair SET v = v + 1 WHERE id = 2;
	RETURN (SELECT sum(v) FROM pair);
END $$`,
		// The task's session finds the deadlock first and is its victim;
		// the holder below waits far longer before looking.
		"ALTER DATABASE "+dsn[strings.LastIndex(dsn, "/")+1:strings.Index(dsn, "?")]+" SET deadlock_timeout = '100ms'")

	holder := srv.Open(t, dsn)
	ctx := context.Background()
	tx, err := holder.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec("SET LOCAL deadlock_timeout = '60s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("UPDATE pair SET v = v WHERE id = 2"); err != nil {
		t.Fatal(err)
	}

	b.publish(t, sqlSubject, sqlTask(t, "deadlock", wire.SQLPayload{DB: "pg", Statement: "SELECT lock_both() AS total /* deadlock-task */"},
		`,"max_attempts":3`))
	// Once the task holds row 1 and sleeps, the holder asks for row 1.
	waitPg(t, dsn, "deadlock-task", "it in pg_sleep", func(r []pgtest.Backend) bool { return len(r) == 1 && r[0].WaitEvent == "PgSleep" })
	done := make(chan error, 1)
	go func() {
		if _, err := tx.Exec("UPDATE pair SET v = v WHERE id = 1"); err != nil {
			done <- err
			return
		}
		done <- tx.Commit()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("holder = %v, want the task to be the deadlock's victim", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("holder still blocked after 20s: no deadlock detected")
	}

	rec := b.waitState(t, "deadlock", wire.TaskSucceeded, 20*time.Second)
	if rec.Attempts != 2 || string(rec.Result) != `{"columns":["total"],"rows":[[2]]}` {
		t.Errorf("deadlock task = attempts %d, result %s; want 2 attempts and total 2", rec.Attempts, rec.Result)
	}
	retry := b.waitEvents(t, "deadlock", wire.EventRetryScheduled, 1, 5*time.Second)[0]
	if !strings.Contains(retry.Message, "40P01") || payload(t, retry)["class"] != ClassRetry.String() {
		t.Errorf("RETRY_SCHEDULED = %q %v, want a retry after deadlock_detected (40P01)", retry.Message, payload(t, retry))
	}
}

// TestSQLTaskPasswordNeverShown runs sql tasks that succeed, fail and fail
// to connect, and looks for the DSN's password in the logs, the events and
// the task records.
func TestSQLTaskPasswordNeverShown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := pg.Get(t)
	wrong := strings.Replace(srv.DSN("postgres"), srv.Password, srv.Password+"-wrong", 1)
	dsn, logs := pgWorkers(t, b, sqltask.Database{Name: "wrong", Driver: sqltask.Postgres, DSN: wrong})

	for id, p := range map[string]wire.SQLPayload{
		"ok":     {DB: "pg", Statement: "SELECT current_user"},
		"broken": {DB: "pg", Statement: "SELECT * FROM nope"},
		"denied": {DB: "wrong", Statement: "SELECT 1"},
	} {
		b.publish(t, sqlSubject, sqlTask(t, id, p, ""))
	}
	b.waitState(t, "ok", wire.TaskSucceeded, 10*time.Second)
	b.waitState(t, "broken", wire.TaskNeedsReview, 10*time.Second)
	rec := b.waitState(t, "denied", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "28P01") {
		t.Errorf("wrong password = attempts %d, %q; want NEEDS_REVIEW at once with 28P01", rec.Attempts, rec.LastError)
	}
	for _, id := range []string{"ok", "broken", "denied"} {
		b.waitEvents(t, id, wire.EventTaskFinished, 1, 5*time.Second)
	}

	var seen []string
	seen = append(seen, logs.String())
	b.mu.Lock()
	for _, ev := range b.events {
		data, _ := json.Marshal(ev)
		seen = append(seen, string(data))
	}
	b.mu.Unlock()
	list, err := b.tasks.List(context.Background(), func(wire.TaskRecord) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		data, _ := json.Marshal(r)
		seen = append(seen, string(data))
	}
	if !strings.Contains(logs.String(), "28P01") {
		t.Errorf("logs hold no trace of the failed login; the check below would prove nothing:\n%s", logs)
	}
	for _, s := range seen {
		if strings.Contains(s, srv.Password) || strings.Contains(s, dsn) {
			t.Errorf("found the database password in %s", s)
		}
	}
}
