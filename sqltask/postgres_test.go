package sqltask

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
)

// pgDB returns Databases holding a fresh PostgreSQL database as "pg", with
// a readings table, and the database's DSN.
func pgDB(t *testing.T) (*Databases, string) {
	t.Helper()
	srv := pg.Get(t)
	dsn := srv.NewDatabase(t)
	srv.Exec(t, dsn, `CREATE TABLE readings (id serial PRIMARY KEY, sensor text NOT NULL UNIQUE, value double precision)`)
	return open(t, Database{Name: "pg", Driver: Postgres, DSN: dsn}), dsn
}

func TestPostgresBoundArgs(t *testing.T) {
	t.Parallel()
	d, _ := pgDB(t)

	res := mustRun(t, d, "pg", "INSERT INTO readings (sensor, value) VALUES ($1, $2)", `["t1", 21.5]`)
	if res.RowsAffected == nil || *res.RowsAffected != 1 {
		t.Errorf("insert = %s, want rows_affected 1", jsonOf(t, res))
	}
	res = mustRun(t, d, "pg", "INSERT INTO readings (sensor, value) VALUES (@sensor, @value) RETURNING id, sensor, value",
		`{"sensor": "t2", "value": 7}`)
	if got, want := jsonOf(t, res), `{"columns":["id","sensor","value"],"rows":[[2,"t2",7]]}`; got != want {
		t.Errorf("named insert returning = %s, want %s", got, want)
	}
	res = mustRun(t, d, "pg", "UPDATE readings SET value = value + $1", `[1]`)
	if res.RowsAffected == nil || *res.RowsAffected != 2 {
		t.Errorf("update = %s, want rows_affected 2", jsonOf(t, res))
	}

	// An injection attempt through args is stored as data.
	evil := `t3'); DROP TABLE readings; --`
	args, _ := json.Marshal([]any{evil})
	mustRun(t, d, "pg", "INSERT INTO readings (sensor) VALUES ($1)", string(args))
	res = mustRun(t, d, "pg", "SELECT sensor FROM readings WHERE sensor LIKE 't3%'", "")
	if len(res.Rows) != 1 || res.Rows[0][0] != evil {
		t.Errorf("injected row = %s, want the text %q stored as data", jsonOf(t, res), evil)
	}
	if got := jsonOf(t, mustRun(t, d, "pg", "SELECT count(*) FROM readings", "").Rows); got != "[[3]]" {
		t.Errorf("rows after the injection attempt = %s, want [[3]]", got)
	}

	// Types: json arrives as JSON, times as RFC 3339, numeric as text.
	res = mustRun(t, d, "pg", `SELECT $1::jsonb AS doc, '2026-11-30 03:12:00+00'::timestamptz AS at, 1.50::numeric AS n, NULL AS nothing`,
		`[{"a": [1, 2]}]`)
	if got, want := jsonOf(t, res.Rows), `[[{"a":[1,2]},"2026-11-30T03:12:00Z","1.50",null]]`; got != want {
		t.Errorf("typed row = %s, want %s", got, want)
	}
}

func TestPostgresFunctionAndProcedure(t *testing.T) {
	t.Parallel()
	d, dsn := pgDB(t)
	pg.Get(t).Exec(t, dsn, `
CREATE FUNCTION add_reading(s text, v double precision) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE n integer;
BEGIN
	INSERT INTO readings (sensor, value) VALUES (s, v);
	SELECT count(*) INTO n FROM readings;
	RETURN n;
END $$`, `
CREATE PROCEDURE summarise(IN lim double precision, INOUT total double precision) LANGUAGE plpgsql AS $$
BEGIN
	SELECT coalesce(sum(value), 0) INTO total FROM readings WHERE value < lim;
END $$`)

	res := mustRun(t, d, "pg", "SELECT add_reading($1, $2) AS n", `["t1", 2]`)
	if got, want := jsonOf(t, res), `{"columns":["n"],"rows":[[1]]}`; got != want {
		t.Errorf("function call = %s, want %s", got, want)
	}
	mustRun(t, d, "pg", "SELECT add_reading(@s, @v)", `{"s": "t2", "v": 3.5}`)
	res = mustRun(t, d, "pg", "CALL summarise($1, NULL)", `[10]`)
	if got, want := jsonOf(t, res), `{"columns":["total"],"rows":[[5.5]]}`; got != want {
		t.Errorf("procedure call = %s, want %s", got, want)
	}
}

// waitGone waits until no statement holding marker runs on the server.
func waitGone(t *testing.T, dsn, marker string) {
	t.Helper()
	check.For(t, 2*time.Second, 20*time.Millisecond, func() error {
		if n := len(pg.Get(t).Running(t, dsn, marker)); n > 0 {
			return fmt.Errorf("pg_stat_activity shows %d statements %q running, want them cancelled on the server", n, marker)
		}
		return nil
	})
}

// waitRunning waits until a statement holding marker runs on the server.
func waitRunning(t *testing.T, dsn, marker string) {
	t.Helper()
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if len(pg.Get(t).Running(t, dsn, marker)) == 0 {
			return fmt.Errorf("pg_stat_activity shows no statement %q running", marker)
		}
		return nil
	})
}

func TestPostgresTimeoutCancelsOnServer(t *testing.T) {
	t.Parallel()
	d, dsn := pgDB(t)

	// The payload's timeout.
	start := time.Now()
	_, err := d.Run(context.Background(), wire.SQLPayload{DB: "pg", Statement: "SELECT pg_sleep(30) /* timeout-marker */", Timeout: "300ms"})
	if kindOf(t, err) != KindTimeout || !strings.Contains(err.Error(), "timed out after 300ms") {
		t.Errorf("pg_sleep(30) with timeout 300ms = %v, want a timeout", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("pg_sleep(30) with timeout 300ms returned after %v", el)
	}
	waitGone(t, dsn, "timeout-marker")

	// A cancelled context (a cancelled or timed-out task).
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := d.Run(ctx, wire.SQLPayload{DB: "pg", Statement: "SELECT pg_sleep(30) /* cancel-marker */"})
		errc <- err
	}()
	waitRunning(t, dsn, "cancel-marker")
	cancel()
	select {
	case err := <-errc:
		if kindOf(t, err) != KindTimeout || err.(*Error).Code != "57014" {
			t.Errorf("cancelled pg_sleep = %v (code %s), want query_canceled 57014", err, err.(*Error).Code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled pg_sleep(30) still running after 5s")
	}
	waitGone(t, dsn, "cancel-marker")
	// The pool's connection works afterwards.
	mustRun(t, d, "pg", "SELECT 1", "")
}

func TestPostgresErrors(t *testing.T) {
	t.Parallel()
	srv := pg.Get(t)
	d, dsn := pgDB(t)
	mustRun(t, d, "pg", "INSERT INTO readings (sensor) VALUES ('dup')", "")
	for _, tc := range []struct {
		name, stmt, args, code string
		want                   Kind
	}{
		{"syntax", "SELEC 1", "", "42601", KindSyntax},
		{"missing table", "SELECT * FROM nope", "", "42P01", KindMissing},
		{"missing function", "SELECT nope()", "", "42883", KindMissing},
		{"unique", "INSERT INTO readings (sensor) VALUES ('dup')", "", "23505", KindConstraint},
		{"not null", "INSERT INTO readings (sensor) VALUES ($1)", "[null]", "23502", KindConstraint},
		{"division by zero", "SELECT 1 / $1::int", "[0]", "22012", KindData},
		{"bad input", "SELECT $1::int", `["seven"]`, "22P02", KindData},
		{"raised", "DO $$ BEGIN RAISE EXCEPTION 'shift not closed'; END $$", "", "P0001", KindRaised},
		{"arg count", "SELECT $1", "[1, 2]", "", KindInvalid},
		{"two statements with args", "SELECT $1; SELECT 2", "[1]", "42601", KindSyntax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, d, "pg", tc.stmt, tc.args)
			if got := kindOf(t, err); got != tc.want || err.(*Error).Code != tc.code {
				t.Errorf("%s = %v (kind %s, code %q), want kind %s, code %q", tc.stmt, err, got, err.(*Error).Code, tc.want, tc.code)
			}
			if !err.(*Error).Permanent() {
				t.Errorf("%s: Permanent() = false, want true", tc.stmt)
			}
		})
	}

	// A lock held by another session, under a lock_timeout: retryable.
	srv.Exec(t, dsn, "ALTER ROLE gantry IN DATABASE "+dbName(dsn)+" SET lock_timeout = '100ms'")
	holder := srv.Open(t, dsn)
	tx, err := holder.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("LOCK TABLE readings IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	locked := open(t, Database{Name: "pg", Driver: Postgres, DSN: dsn})
	_, err = run(t, locked, "pg", "SELECT count(*) FROM readings", "")
	if kindOf(t, err) != KindLockTimeout || err.(*Error).Permanent() {
		t.Errorf("select under another's lock = %v, want a retryable lock_timeout", err)
	}
	_ = tx.Rollback()

	// Permission: a role without rights on the table.
	srv.Exec(t, dsn, "CREATE ROLE reader LOGIN PASSWORD 'reader-pw'")
	readerDSN := strings.Replace(dsn, "gantry:"+srv.Password, "reader:reader-pw", 1)
	reader := open(t, Database{Name: "pg", Driver: Postgres, DSN: readerDSN})
	_, err = run(t, reader, "pg", "SELECT * FROM readings", "")
	if kindOf(t, err) != KindPermission || err.(*Error).Code != "42501" {
		t.Errorf("select without privilege = %v, want permission 42501", err)
	}
}

// dbName is the database a DSN names.
func dbName(dsn string) string {
	name := dsn[strings.LastIndex(dsn, "/")+1:]
	name, _, _ = strings.Cut(name, "?")
	return name
}

// TestPostgresSecretsNotShown checks that connection errors name the
// database, never its DSN or password.
func TestPostgresSecretsNotShown(t *testing.T) {
	t.Parallel()
	srv := pg.Get(t)
	dsn := srv.NewDatabase(t)

	// A wrong password: permanent, and the error holds neither password.
	wrong := strings.Replace(dsn, srv.Password, "wrong-"+srv.Password, 1)
	d := open(t, Database{Name: "pg", Driver: Postgres, DSN: wrong})
	_, err := run(t, d, "pg", "SELECT 1", "")
	if kindOf(t, err) != KindPermission || err.(*Error).Code != "28P01" {
		t.Errorf("wrong password = %v, want permission 28P01", err)
	}
	if strings.Contains(err.Error(), srv.Password) || !strings.HasPrefix(err.Error(), "db pg: ") {
		t.Errorf("wrong password error = %q, want it to start with the db's name and hold no password", err)
	}

	// Nobody listening: a retryable connection loss, without the DSN.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	down := fmt.Sprintf("postgres://gantry:%s@127.0.0.1:%d/x?sslmode=disable&connect_timeout=2", srv.Password, port)
	d = open(t, Database{Name: "down", Driver: Postgres, DSN: down})
	_, err = run(t, d, "down", "SELECT 1", "")
	if kindOf(t, err) != KindConnection || err.(*Error).Permanent() {
		t.Errorf("server down = %v, want a retryable connection_loss", err)
	}
	if strings.Contains(err.Error(), srv.Password) {
		t.Errorf("server down error = %q, holds the password", err)
	}

	// A DSN that does not parse: New fails without echoing it.
	_, err = New([]Database{{Name: "bad", Driver: Postgres, DSN: "postgres://gantry:" + srv.Password + "@127.0.0.1:notaport/x"}})
	if err == nil || strings.Contains(err.Error(), srv.Password) {
		t.Errorf("New with a bad DSN = %v, want an error without the password", err)
	}
}
