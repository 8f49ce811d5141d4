// Package pgtest starts a real PostgreSQL server for the tests of a
// package: initdb into a temporary directory, pg_ctl start on a free
// loopback port with password (scram-sha-256) authentication, and pg_ctl
// stop at the end. As root, the server runs as the postgres user, since
// PostgreSQL refuses to run as root.
//
// A package starts one server for all its tests:
//
//	var pg pgtest.Shared
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { pg.Stop(); os.Exit(code) }))
//	}
//
//	func TestX(t *testing.T) { dsn := pg.Get(t).NewDatabase(t) ... }
//
// Without PostgreSQL's binaries a test skips, loudly, naming the package to
// install; when the environment variable CI is set it fails instead.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// ErrNotInstalled is returned by Start when PostgreSQL's server binaries
// are not on this machine.
var ErrNotInstalled = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found; install them with: apt-get install -y postgresql")

// User is the superuser of a test server.
const User = "gantry"

// Server is a running PostgreSQL server.
type Server struct {
	// Port is the server's port on 127.0.0.1.
	Port int
	// Password is User's password: random, a fresh one per server.
	Password string

	dir   string
	bin   string
	runAs string
	n     atomic.Int64
}

// Shared is a server started on first use by the tests of a package and
// stopped by Stop, from TestMain.
type Shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Get returns the shared server, starting it on first use. Without
// PostgreSQL's binaries it skips t (fails it when CI is set).
func (s *Shared) Get(t testing.TB) *Server {
	t.Helper()
	s.once.Do(func() { s.srv, s.err = Start() })
	switch {
	case errors.Is(s.err, ErrNotInstalled) && os.Getenv("CI") != "":
		t.Fatalf("CI is set and PostgreSQL is missing: %v (.ci/run installs it)", s.err)
	case errors.Is(s.err, ErrNotInstalled):
		t.Skipf("\n\n*** SKIPPED: this test needs a real PostgreSQL server. ***\n*** %v ***\n", s.err)
	case s.err != nil:
		t.Fatalf("start PostgreSQL: %v", s.err)
	}
	return s.srv
}

// Stop stops the server if one was started.
func (s *Shared) Stop() {
	if s.srv != nil {
		if err := s.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
}

// binDir finds the directory holding initdb and pg_ctl: Debian's
// /usr/lib/postgresql/<version>/bin (the highest version), else PATH.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if executable(filepath.Join(d, "initdb")) && executable(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		d := filepath.Dir(p)
		if executable(filepath.Join(d, "initdb")) {
			return d, nil
		}
	}
	return "", ErrNotInstalled
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Start initialises a cluster in a new temporary directory and starts a
// server on a free loopback port.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	var pw [12]byte
	if _, err := rand.Read(pw[:]); err != nil {
		return nil, err
	}
	s := &Server{Password: "pw-" + hex.EncodeToString(pw[:]), bin: bin}
	if s.dir, err = os.MkdirTemp("", "gantry-pgtest-"); err != nil {
		return nil, err
	}
	if err := s.start(); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	pwfile := filepath.Join(s.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(s.Password+"\n"), 0o600); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root, and no postgres user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{s.dir, pwfile} {
			if err := os.Chown(p, uid, gid); err != nil {
				return err
			}
		}
		s.runAs = u.Username
	}
	data := filepath.Join(s.dir, "data")
	if out, err := s.run("initdb", "-D", data, "-U", User, "--pwfile", pwfile, "--auth=scram-sha-256",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return err
		}
		opts := "-c listen_addresses=127.0.0.1 -p " + strconv.Itoa(port) +
			" -c unix_socket_directories='' -c fsync=off -c synchronous_commit=off -c full_page_writes=off" +
			" -c max_connections=200"
		out, err := s.run("pg_ctl", "-D", data, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "-o", opts, "start")
		if err == nil {
			s.Port = port
			return nil
		}
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		lastErr = fmt.Errorf("pg_ctl start: %w: %s\n%s", err, out, log)
	}
	return lastErr
}

// run runs a PostgreSQL program, as the postgres user when root.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, prog)
	cmd := exec.Command(path, args...)
	if s.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

// freePort returns a loopback port nothing listens on just now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Stop stops the server at once and removes its directory.
func (s *Server) Stop() error {
	out, err := s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	if err != nil {
		err = fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// DSN is the URL of database db as User, with the password.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", User, s.Password, s.Port, db)
}

// NewDatabase creates a database of its own for t and returns its DSN.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.n.Add(1))
	s.Exec(t, s.DSN("postgres"), "CREATE DATABASE "+name)
	return s.DSN(name)
}

// Open opens dsn with pgx's database/sql driver, closed when t ends.
func (s *Server) Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Exec runs statements on dsn, each in turn, failing t on an error.
func (s *Server) Exec(t testing.TB, dsn string, stmts ...string) {
	t.Helper()
	db := s.Open(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", strings.TrimSpace(q), err)
		}
	}
	_ = db.Close()
}

// Backend is a server process running a statement, as pg_stat_activity
// shows it.
type Backend struct {
	PID int
	// WaitEvent is what it waits for ("PgSleep" in pg_sleep,
	// "transactionid" for a row lock), or "".
	WaitEvent string
}

// Running lists the backends of dsn's server running a statement (state
// active) whose text holds marker, other than the one asking.
func (s *Server) Running(t testing.TB, dsn, marker string) []Backend {
	t.Helper()
	db := s.Open(t, dsn)
	defer db.Close()
	rows, err := db.Query(`SELECT pid, coalesce(wait_event, '') FROM pg_stat_activity
		WHERE state = 'active' AND strpos(query, $1) > 0 AND pid <> pg_backend_pid()`, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Backend
	for rows.Next() {
		var b Backend
		if err := rows.Scan(&b.PID, &b.WaitEvent); err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
