package sqltask

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/internal/pgtest"
)

// pg is the PostgreSQL server of this package's tests, started by the
// first test that needs it.
var pg pgtest.Shared

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options(goleak.Cleanup(func(code int) {
		pg.Stop()
		os.Exit(code)
	}))...)
}

// open returns Databases holding dbs, closed when t ends.
func open(t *testing.T, dbs ...Database) *Databases {
	t.Helper()
	d, err := New(dbs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// run runs one statement of db with args (a JSON array or object, or "").
func run(t *testing.T, d *Databases, db, statement, args string) (wire.SQLResult, error) {
	t.Helper()
	p := wire.SQLPayload{DB: db, Statement: statement}
	if args != "" {
		p.Args = json.RawMessage(args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return d.Run(ctx, p)
}

// mustRun is run, failing t on an error.
func mustRun(t *testing.T, d *Databases, db, statement, args string) wire.SQLResult {
	t.Helper()
	res, err := run(t, d, db, statement, args)
	if err != nil {
		t.Fatalf("%s: %v", statement, err)
	}
	return res
}

// kindOf returns the kind of a Run error, failing t when it is not an
// *Error.
func kindOf(t *testing.T, err error) Kind {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error = %v (%T), want an *Error", err, err)
	}
	return e.Kind
}

// jsonOf is v as JSON, for comparing results.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
