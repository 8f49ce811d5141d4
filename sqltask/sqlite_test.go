package sqltask

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
)

// sqliteDB returns Databases holding a fresh SQLite file as "plant", with a
// readings table, and the file's path.
func sqliteDB(t *testing.T) (*Databases, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plant.db")
	d := open(t, Database{Name: "plant", Driver: SQLite, DSN: "file:" + path})
	mustRun(t, d, "plant", `CREATE TABLE readings (id INTEGER PRIMARY KEY, sensor TEXT NOT NULL UNIQUE, value REAL, at TEXT)`, "")
	return d, path
}

func TestSQLiteBoundArgs(t *testing.T) {
	t.Parallel()
	d, _ := sqliteDB(t)

	res := mustRun(t, d, "plant", "INSERT INTO readings (sensor, value) VALUES (?, ?)", `["t1", 21.5]`)
	if res.RowsAffected == nil || *res.RowsAffected != 1 || res.Rows != nil {
		t.Errorf("insert result = %s, want rows_affected 1 and no rows", jsonOf(t, res))
	}
	res = mustRun(t, d, "plant", "INSERT INTO readings (sensor, value) VALUES (:sensor, :value)", `{"sensor": "t2", "value": 7}`)
	if res.RowsAffected == nil || *res.RowsAffected != 1 {
		t.Errorf("named insert result = %s, want rows_affected 1", jsonOf(t, res))
	}
	res = mustRun(t, d, "plant", "INSERT INTO readings (sensor, value) VALUES (?, ?) RETURNING id, sensor", `["t3", null]`)
	if got, want := jsonOf(t, res), `{"columns":["id","sensor"],"rows":[[3,"t3"]]}`; got != want {
		t.Errorf("insert returning = %s, want %s", got, want)
	}
	res = mustRun(t, d, "plant", "SELECT sensor, value FROM readings WHERE value > ? ORDER BY id", `[1]`)
	if got, want := jsonOf(t, res), `{"columns":["sensor","value"],"rows":[["t1",21.5],["t2",7]]}`; got != want {
		t.Errorf("select = %s, want %s", got, want)
	}

	// An injection attempt through args is data: the table survives and
	// holds the text as it was given.
	evil := `x'); DROP TABLE readings; --`
	args, _ := json.Marshal([]any{evil})
	mustRun(t, d, "plant", "INSERT INTO readings (sensor) VALUES (?)", string(args))
	res = mustRun(t, d, "plant", "SELECT sensor FROM readings WHERE id = 4", "")
	if len(res.Rows) != 1 || res.Rows[0][0] != evil {
		t.Errorf("injected row = %s, want the text %q stored as data", jsonOf(t, res), evil)
	}
	res = mustRun(t, d, "plant", "SELECT count(*) FROM readings", "")
	if got := jsonOf(t, res.Rows); got != "[[4]]" {
		t.Errorf("rows after the injection attempt = %s, want [[4]]", got)
	}
}

func TestSQLiteMaxRowsAndTx(t *testing.T) {
	t.Parallel()
	d, _ := sqliteDB(t)
	mustRun(t, d, "plant", `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 500)
		INSERT INTO readings (sensor, value) SELECT 's' || i, i FROM n`, "")

	ctx := context.Background()
	res, err := d.Run(ctx, wire.SQLPayload{DB: "plant", Statement: "SELECT sensor FROM readings ORDER BY id", MaxRows: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := jsonOf(t, res), `{"columns":["sensor"],"rows":[["s1"],["s2"],["s3"]],"truncated":true}`; got != want {
		t.Errorf("max_rows 3 = %s, want %s", got, want)
	}
	// The default max_rows, and the size bound on wide rows.
	res = mustRun(t, d, "plant", "SELECT id FROM readings", "")
	if len(res.Rows) != DefaultMaxRows || !res.Truncated {
		t.Errorf("default max_rows = %d rows, truncated %v; want %d, true", len(res.Rows), res.Truncated, DefaultMaxRows)
	}
	res, err = d.Run(ctx, wire.SQLPayload{DB: "plant", Statement: "SELECT printf('%.3000c', 'x') FROM readings", MaxRows: 500})
	if err != nil {
		t.Fatal(err)
	}
	if size := len(jsonOf(t, res.Rows)); size > MaxResultBytes || !res.Truncated || len(res.Rows) == 0 {
		t.Errorf("wide rows = %d rows, %d bytes, truncated %v; want some rows, at most %d bytes, truncated", len(res.Rows), size, res.Truncated, MaxResultBytes)
	}

	// A failing statement in a transaction leaves nothing behind.
	_, err = d.Run(ctx, wire.SQLPayload{DB: "plant", Tx: true,
		Statement: "UPDATE readings SET sensor = 's1' WHERE id = 2"})
	if kindOf(t, err) != KindConstraint {
		t.Errorf("duplicate sensor = %v, want a constraint error", err)
	}
	res, err = d.Run(ctx, wire.SQLPayload{DB: "plant", Tx: true, Statement: "UPDATE readings SET value = -1 WHERE id <= 10"})
	if err != nil || res.RowsAffected == nil || *res.RowsAffected != 10 {
		t.Errorf("update in a tx = %s, %v; want rows_affected 10", jsonOf(t, res), err)
	}
}

func TestSQLiteErrors(t *testing.T) {
	t.Parallel()
	d, path := sqliteDB(t)
	mustRun(t, d, "plant", "INSERT INTO readings (sensor) VALUES ('dup')", "")
	for _, tc := range []struct {
		name, stmt, args string
		want             Kind
	}{
		{"syntax", "SELEC 1", "", KindSyntax},
		{"missing table", "SELECT * FROM nope", "", KindMissing},
		{"missing column", "SELECT nope FROM readings", "", KindMissing},
		{"unique", "INSERT INTO readings (sensor) VALUES ('dup')", "", KindConstraint},
		{"not null", "INSERT INTO readings (sensor) VALUES (?)", "[null]", KindConstraint},
		{"args not a list", "SELECT 1", `"x"`, KindInvalid},
		{"unknown db", "SELECT 1", "", KindInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := "plant"
			if tc.name == "unknown db" {
				db = "nope"
			}
			_, err := run(t, d, db, tc.stmt, tc.args)
			if got := kindOf(t, err); got != tc.want {
				t.Errorf("%s = %v (kind %s), want kind %s", tc.stmt, err, got, tc.want)
			}
			if tc.want.Retryable() || !err.(*Error).Permanent() {
				t.Errorf("%s: Permanent() = false, want true", tc.stmt)
			}
		})
	}

	// A writer locked out by another is a lock timeout: retryable.
	ctx := context.Background()
	lock := lockDB(t, path, "EXCLUSIVE")
	busy := open(t, Database{Name: "busy", Driver: SQLite, DSN: "file:" + path + "?_pragma=busy_timeout(50)"})
	_, err := run(t, busy, "busy", "INSERT INTO readings (sensor) VALUES ('late')", "")
	if got := kindOf(t, err); got != KindLockTimeout || err.(*Error).Permanent() {
		t.Errorf("insert under another's lock = %v (kind %s), want a retryable lock_timeout", err, got)
	}
	if _, err := lock.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
}

func TestSQLiteTimeout(t *testing.T) {
	t.Parallel()
	d, _ := sqliteDB(t)
	slow := "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n) SELECT count(*) FROM n"
	start := time.Now()
	_, err := d.Run(context.Background(), wire.SQLPayload{DB: "plant", Statement: slow, Timeout: "200ms"})
	if kindOf(t, err) != KindTimeout || !strings.Contains(err.Error(), "timed out after 200ms") {
		t.Errorf("endless query with timeout 200ms = %v, want a timeout", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("endless query stopped after %v, want soon after its 200ms timeout", el)
	}
	// A cancelled context interrupts it the same way.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = d.Run(ctx, wire.SQLPayload{DB: "plant", Statement: slow})
	if kindOf(t, err) != KindTimeout {
		t.Errorf("cancelled endless query = %v, want kind timeout", err)
	}
	// The connection is fine afterwards.
	mustRun(t, d, "plant", "SELECT 1", "")
}

// TestSQLiteErrorCodes checks the classification of SQLite's real errors by
// their result code.
func TestSQLiteErrorCodes(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec("CREATE TABLE t (a INTEGER CHECK (a > 0))")
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec("INSERT INTO t VALUES (-1)")
	var se *sqlite.Error
	if !errors.As(err, &se) {
		t.Fatalf("check violation = %v, want a *sqlite.Error", err)
	}
	if code, kind := classifySQLite(err); kind != KindConstraint || code != "275" {
		t.Errorf("classifySQLite(CHECK violation) = %s, %s; want 275 (SQLITE_CONSTRAINT_CHECK), constraint", code, kind)
	}
}

// TestSQLiteMaxOpen runs several statements at once on a database of
// max_open 1 while another connection holds the write lock: one statement
// takes the pool's only connection and waits for the lock, the others wait
// for the connection, and the pool never opens a second. Once the lock is
// released every statement runs.
func TestSQLiteMaxOpen(t *testing.T) {
	t.Parallel()
	const n = 3
	path := filepath.Join(t.TempDir(), "plant.db")
	// A busy timeout longer than the wait below: the statement holding the
	// connection waits for the lock instead of failing.
	d := open(t, Database{Name: "plant", Driver: SQLite, DSN: "file:" + path + "?_pragma=busy_timeout(60000)", MaxOpen: 1})
	mustRun(t, d, "plant", "CREATE TABLE readings (sensor TEXT)", "")
	_, pool, err := d.pool("plant")
	if err != nil {
		t.Fatal(err)
	}
	if got := pool.Stats().MaxOpenConnections; got != 1 {
		t.Fatalf("MaxOpenConnections = %d, want 1", got)
	}

	ctx := context.Background()
	lock := lockDB(t, path, "IMMEDIATE")
	waits := pool.Stats().WaitCount
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := run(t, d, "plant", "INSERT INTO readings VALUES (?)", fmt.Sprintf(`["s%d"]`, i))
			errs <- err
		}()
	}
	check.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		s := pool.Stats()
		if s.OpenConnections > 1 {
			t.Fatalf("OpenConnections = %d with max_open 1, want at most 1", s.OpenConnections)
		}
		if s.InUse != 1 || s.WaitCount-waits != n-1 {
			return fmt.Errorf("in use %d, waited for a connection %d; want 1 and %d", s.InUse, s.WaitCount-waits, n-1)
		}
		return nil
	})
	if _, err := lock.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("insert = %v, want nil once the lock is released", err)
		}
	}
	if got := jsonOf(t, mustRun(t, d, "plant", "SELECT count(*) FROM readings", "").Rows); got != fmt.Sprintf("[[%d]]", n) {
		t.Errorf("rows = %s, want [[%d]]", got, n)
	}
	if got := pool.Stats().OpenConnections; got != 1 {
		t.Errorf("OpenConnections at the end = %d, want 1", got)
	}
}

// lockDB opens the SQLite database at path on a connection of its own and
// begins a transaction of mode (EXCLUSIVE, IMMEDIATE) on it, holding the
// database's lock until the connection's end (closed with the test).
func lockDB(t *testing.T, path, mode string) *sql.Conn {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(context.Background(), "BEGIN "+mode); err != nil {
		t.Fatal(err)
	}
	return conn
}
