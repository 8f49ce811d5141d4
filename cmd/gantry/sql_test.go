//go:build !windows

package main

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// startGantryLogs is startGantry with extra environment variables, keeping
// every log line of the child in the returned buffer.
func startGantryLogs(t *testing.T, env []string, args ...string) (*exec.Cmd, logLine, *syncBuffer) {
	t.Helper()
	cmd := gantryCmd(t, append(args, "--log-format", "json")...)
	cmd.Env = append(cmd.Env, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	logs := &syncBuffer{}
	ready := make(chan logLine, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(logs, sc.Text())
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == readyMsg {
				ready <- l
			}
			t.Log(sc.Text())
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case l := <-ready:
		return cmd, l, logs
	case <-time.After(20 * time.Second):
		t.Fatal("no ready line within 20s")
	}
	return nil, logLine{}, nil
}

// TestSQLEndToEnd runs 'gantry submit sql' against 'gantry run' with a
// config naming a SQLite database, and a job that schedules sql tasks.
func TestSQLEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "plant.db")
	db, err := sql.Open("sqlite", "file:"+dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE readings (sensor TEXT NOT NULL, value REAL)"); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fmt.Sprintf(`databases:
  - {name: plant, driver: sqlite, dsn: "file:%s"}
jobs:
  - name: sample
    type: sql
    every: 1s
    payload: {db: plant, statement: "INSERT INTO readings (sensor, value) VALUES (?, ?)", args: [job, 1]}
`, dbPath))
	_, ready, _ := startGantryLogs(t, nil, "run", "--config", cfg, "--data", filepath.Join(dir, "data"),
		"--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS

	// Insert with bound args.
	code, out, stderr := runInProcess(t, "submit", "sql", "--db", "plant", "--server", url, "--wait",
		"--statement", "INSERT INTO readings (sensor, value) VALUES (?, ?)", "--arg", "t1", "--arg", "21.5")
	if code != exitOK || !strings.Contains(out, "SUCCEEDED after 1 attempt(s)") {
		t.Fatalf("submit sql insert --wait = exit %d, %q (%s); want 0 and SUCCEEDED", code, out, stderr)
	}
	id := strings.Fields(out)[0]
	code, out, _ = runInProcess(t, "task", "get", id, "--server", url)
	if code != exitOK || !strings.Contains(out, "result:") || !strings.Contains(out, "rows_affected  1") {
		t.Errorf("task get of the insert = exit %d:\n%s\nwant its result, rows_affected 1", code, out)
	}

	// An injection attempt through --arg is stored as data.
	evil := "x'); DROP TABLE readings; --"
	if code, out, stderr := runInProcess(t, "submit", "sql", "--db", "plant", "--server", url, "--wait",
		"--statement", "INSERT INTO readings (sensor) VALUES (?)", "--arg", evil); code != exitOK {
		t.Fatalf("submit sql with an injection attempt = exit %d, %q (%s); want 0", code, out, stderr)
	}

	// A query: its rows are the result, in --json and in task get.
	code, out, stderr = runInProcess(t, "submit", "sql", "--db", "plant", "--server", url, "--wait", "--json",
		"--statement", "SELECT sensor, value FROM readings WHERE sensor <> ? ORDER BY rowid", "--arg", `"job"`)
	var rec wire.TaskRecord
	if err := json.Unmarshal([]byte(out), &rec); code != exitOK || err != nil {
		t.Fatalf("submit sql select --wait --json = exit %d, %q (%s), %v", code, out, stderr, err)
	}
	rows, _ := json.Marshal([][]any{{"t1", 21.5}, {evil, nil}})
	var got bytes.Buffer
	if err := json.Compact(&got, rec.Result); err != nil {
		t.Fatal(err)
	}
	if want := `{"columns":["sensor","value"],"rows":` + string(rows) + `}`; got.String() != want {
		t.Errorf("select result = %s, want %s", got.String(), want)
	}
	code, out, _ = runInProcess(t, "task", "get", rec.ID, "--server", url)
	if code != exitOK || !strings.Contains(out, "SENSOR") || !strings.Contains(out, "21.5") || !strings.Contains(out, "(2 row(s))") {
		t.Errorf("task get of the select = exit %d:\n%s\nwant a table of its 2 rows", code, out)
	}

	// A syntax error: NEEDS_REVIEW after one attempt, exit 1.
	code, out, _ = runInProcess(t, "submit", "sql", "--db", "plant", "--statement", "SELEC 1", "--wait", "--server", url)
	if code != exitFailure || !strings.Contains(out, "NEEDS_REVIEW after 1 attempt(s)") {
		t.Errorf("submit sql with a syntax error = exit %d, %q; want 1 and NEEDS_REVIEW after 1 attempt", code, out)
	}

	// Bad usage exits 2.
	for _, args := range [][]string{
		{"submit", "noop", "--db", "plant"},
		{"submit", "sql", "--payload", "[1]", "--db", "plant"},
		{"submit", "sql", "--statement", "@/nonexistent.sql"},
	} {
		if code, _, stderr := runInProcess(t, append(args, "--server", url)...); code != exitUsage {
			t.Errorf("%v = exit %d (%s), want 2", args, code, stderr)
		}
	}

	// The job's tasks insert too.
	poll.For(t, 15*time.Second, 100*time.Millisecond, func() error {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM readings WHERE sensor = 'job'").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("no row from the sample job, want one every second")
		}
		return nil
	})
}

// TestSQLBadDatabaseConfig: a DSN its driver cannot parse, or one whose
// source is missing, stops 'gantry run' and 'gantry worker' with exit 2,
// naming the database but not the DSN.
func TestSQLBadDatabaseConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, db, want string }{
		{"unparsable", `{name: erp, driver: sqlserver, dsn: "sqlserver://sa:hunter2-pw@erp:notaport"}`, "database erp: sqlserver dsn"},
		{"unset env", `{name: erp, driver: mysql, dsn_env: GANTRY_TEST_NEVER_SET}`, "GANTRY_TEST_NEVER_SET"},
		{"missing file", `{name: erp, driver: postgres, dsn_file: nope.dsn}`, "dsn_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cfg := writeConfig(t, "databases:\n  - "+tc.db+"\n")
			for _, args := range [][]string{
				{"run", "--config", cfg, "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http-listen", ""},
				{"worker", "--config", cfg, "--server", "nats://127.0.0.1:1"},
			} {
				code, _, stderr := runInProcess(t, append(args, "--log-format", "json")...)
				if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "hunter2") {
					t.Errorf("%s with %s = exit %d, %q; want exit 2 mentioning %q, without the password", args[0], tc.db, code, stderr, tc.want)
				}
			}
		})
	}
}

// TestSQLPasswordNeverShown runs sql tasks against PostgreSQL that
// succeed, fail and fail to log in, through 'gantry run' and the CLI, then
// looks for the DSN's password in every CLI output, the process's logs and
// every file of the data dir.
func TestSQLPasswordNeverShown(t *testing.T) {
	t.Parallel()
	srv := pg.Get(t)
	dsn := srv.NewDatabase(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pg.dsn"), []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(dsn, srv.Password, srv.Password+"-wrong", 1)
	cfg := writeConfig(t, `databases:
  - {name: pg, driver: postgres, dsn_file: `+filepath.Join(dir, "pg.dsn")+`, max_open: 2}
  - {name: wrong, driver: postgres, dsn_env: GANTRY_TEST_WRONG_DSN}
`)
	data := filepath.Join(dir, "data")
	cmd, ready, logs := startGantryLogs(t, []string{"GANTRY_TEST_WRONG_DSN=" + wrong}, "run", "--config", cfg, "--data", data,
		"--nats-listen", "127.0.0.1:0", "--http-listen", "", "--log-level", "debug")
	url := ready.NATS

	var outputs []string
	cli := func(args ...string) (int, string) {
		code, out, stderr := runInProcess(t, append(args, "--server", url)...)
		outputs = append(outputs, out, stderr)
		return code, out + stderr
	}
	for _, tc := range []struct {
		id, db, stmt string
		code         int
		want         string
	}{
		{"ok", "pg", "SELECT current_user AS who", exitOK, "SUCCEEDED"},
		{"broken", "pg", "SELECT * FROM nope", exitFailure, "42P01"},
		{"denied", "wrong", "SELECT 1", exitFailure, "28P01"},
	} {
		if code, out := cli("submit", "sql", "--id", tc.id, "--db", tc.db, "--statement", tc.stmt, "--wait"); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("submit sql %s = exit %d, %q; want %d mentioning %s", tc.id, code, out, tc.code, tc.want)
		}
		cli("task", "get", tc.id)
		cli("task", "get", tc.id, "--json")
		poll.For(t, 10*time.Second, 100*time.Millisecond, func() error {
			if code, out := cli("audit", "query", "--task", tc.id, "--json"); code != exitOK || !strings.Contains(out, string(wire.EventTaskFinished)) {
				return fmt.Errorf("audit query --task %s = exit %d, %s; want its TASK_FINISHED", tc.id, code, out)
			}
			return nil
		})
	}
	cli("task", "ls", "--json")
	cli("audit", "query", "--json", "--limit", "1000")

	// Stop gantry, so that everything is on disk.
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gantry run after SIGINT = %v, want exit 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("gantry run still running 15s after SIGINT")
	}

	// The checks below must have something to look at.
	if !strings.Contains(logs.String(), "28P01") {
		t.Errorf("the logs never mention the failed login (28P01): the search below would prove nothing")
	}
	for i, s := range append(outputs, logs.String()) {
		if strings.Contains(s, srv.Password) {
			t.Errorf("output %d holds the database password:\n%s", i, s)
		}
	}
	found28 := false
	err := filepath.WalkDir(data, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), srv.Password) {
			t.Errorf("%s holds the database password", path)
		}
		found28 = found28 || strings.Contains(string(b), "28P01")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !found28 {
		t.Errorf("no file of the data dir holds the failed login's 28P01: the search would prove nothing")
	}
}
