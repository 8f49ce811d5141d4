package sqltask

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	mssql "github.com/microsoft/go-mssqldb"

	"github.com/gantry-dev/gantry/broker/wire"
)

// TestClassifySQLServer classifies go-mssqldb's own error type by real SQL
// Server error numbers.
func TestClassifySQLServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  mssql.Error
		want Kind
	}{
		{mssql.Error{Number: 1205, Class: 13, Message: "Transaction (Process ID 52) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction."}, KindDeadlock},
		{mssql.Error{Number: 3960, Class: 16, Message: "Snapshot isolation transaction aborted due to update conflict."}, KindSerialization},
		{mssql.Error{Number: 1222, Class: 16, Message: "Lock request time out period exceeded."}, KindLockTimeout},
		{mssql.Error{Number: 40613, Class: 17, Message: "Database 'plant' on server 'x' is not currently available."}, KindFailover},
		{mssql.Error{Number: 983, Class: 14, Message: "Unable to access availability database 'plant'."}, KindFailover},
		{mssql.Error{Number: 10054, Class: 20, Message: "An existing connection was forcibly closed by the remote host."}, KindConnection},
		{mssql.Error{Number: 40501, Class: 20, Message: "The service is currently busy."}, KindResources},
		{mssql.Error{Number: 9999, Class: 21, Message: "an unknown fatal error"}, KindConnection},
		{mssql.Error{Number: 102, Class: 15, Message: "Incorrect syntax near 'SELEC'."}, KindSyntax},
		{mssql.Error{Number: 208, Class: 16, Message: "Invalid object name 'readings'."}, KindMissing},
		{mssql.Error{Number: 2812, Class: 16, Message: "Could not find stored procedure 'collect'."}, KindMissing},
		{mssql.Error{Number: 229, Class: 14, Message: "The SELECT permission was denied on the object 'readings'."}, KindPermission},
		{mssql.Error{Number: 18456, Class: 14, Message: "Login failed for user 'gantry'."}, KindPermission},
		{mssql.Error{Number: 2627, Class: 14, Message: "Violation of PRIMARY KEY constraint 'PK_readings'."}, KindConstraint},
		{mssql.Error{Number: 547, Class: 16, Message: "The INSERT statement conflicted with the FOREIGN KEY constraint."}, KindConstraint},
		{mssql.Error{Number: 8152, Class: 16, Message: "String or binary data would be truncated."}, KindData},
		{mssql.Error{Number: 8134, Class: 16, Message: "Divide by zero error encountered."}, KindData},
		{mssql.Error{Number: 50000, Class: 16, Message: "shift not closed"}, KindRaised},
		{mssql.Error{Number: 51001, Class: 16, Message: "THROW with a user number"}, KindRaised},
		{mssql.Error{Number: 9999, Class: 16, Message: "an unknown user error"}, KindOther},
	} {
		wrapped := fmt.Errorf("exec: %w", tc.err)
		e := classify(SQLServer, wrapped)
		if e.Kind != tc.want || e.Code != fmt.Sprint(tc.err.Number) {
			t.Errorf("classify(mssql.Error{Number: %d}) = kind %s, code %s; want %s, %d", tc.err.Number, e.Kind, e.Code, tc.want, tc.err.Number)
		}
		if e.Permanent() == tc.want.Retryable() {
			t.Errorf("mssql %d: Permanent() = %v, want %v", tc.err.Number, e.Permanent(), !tc.want.Retryable())
		}
	}
	// A fatal error arrives wrapped in a ServerError, a broken stream as a
	// StreamError.
	if e := classify(SQLServer, mssql.StreamError{InnerError: io.ErrUnexpectedEOF}); e.Kind != KindConnection {
		t.Errorf("classify(StreamError) = %s, want connection_loss", e.Kind)
	}
}

// TestClassifyMySQL classifies go-sql-driver/mysql's own error type by real
// MySQL error numbers and SQLSTATEs.
func TestClassifyMySQL(t *testing.T) {
	t.Parallel()
	state := func(s string) (b [5]byte) { copy(b[:], s); return b }
	for _, tc := range []struct {
		err  *mysql.MySQLError
		want Kind
	}{
		{&mysql.MySQLError{Number: 1213, SQLState: state("40001"), Message: "Deadlock found when trying to get lock; try restarting transaction"}, KindDeadlock},
		{&mysql.MySQLError{Number: 1205, SQLState: state("HY000"), Message: "Lock wait timeout exceeded; try restarting transaction"}, KindLockTimeout},
		{&mysql.MySQLError{Number: 1290, SQLState: state("HY000"), Message: "The MySQL server is running with the --read-only option"}, KindFailover},
		{&mysql.MySQLError{Number: 1053, SQLState: state("08S01"), Message: "Server shutdown in progress"}, KindFailover},
		{&mysql.MySQLError{Number: 1927, SQLState: state("70100"), Message: "Connection was killed"}, KindConnection},
		{&mysql.MySQLError{Number: 1040, SQLState: state("08004"), Message: "Too many connections"}, KindResources},
		{&mysql.MySQLError{Number: 1317, SQLState: state("70100"), Message: "Query execution was interrupted"}, KindTimeout},
		{&mysql.MySQLError{Number: 1064, SQLState: state("42000"), Message: "You have an error in your SQL syntax"}, KindSyntax},
		{&mysql.MySQLError{Number: 1146, SQLState: state("42S02"), Message: "Table 'plant.readings' doesn't exist"}, KindMissing},
		{&mysql.MySQLError{Number: 1305, SQLState: state("42000"), Message: "PROCEDURE plant.collect does not exist"}, KindMissing},
		{&mysql.MySQLError{Number: 1142, SQLState: state("42000"), Message: "SELECT command denied to user 'gantry'"}, KindPermission},
		{&mysql.MySQLError{Number: 1045, SQLState: state("28000"), Message: "Access denied for user 'gantry'@'localhost'"}, KindPermission},
		{&mysql.MySQLError{Number: 1062, SQLState: state("23000"), Message: "Duplicate entry 't1' for key 'sensor'"}, KindConstraint},
		{&mysql.MySQLError{Number: 1452, SQLState: state("23000"), Message: "Cannot add or update a child row: a foreign key constraint fails"}, KindConstraint},
		{&mysql.MySQLError{Number: 1406, SQLState: state("22001"), Message: "Data too long for column 'sensor'"}, KindData},
		{&mysql.MySQLError{Number: 1644, SQLState: state("45000"), Message: "shift not closed"}, KindRaised},
		{&mysql.MySQLError{Number: 4025, SQLState: state("23000"), Message: "CONSTRAINT failed (unknown number, known class)"}, KindConstraint},
		{&mysql.MySQLError{Number: 9999, SQLState: state("HY000"), Message: "unknown"}, KindOther},
	} {
		e := classify(MySQL, fmt.Errorf("exec: %w", tc.err))
		if e.Kind != tc.want || e.Code != fmt.Sprint(tc.err.Number) {
			t.Errorf("classify(MySQLError{Number: %d}) = kind %s, code %s; want %s, %d", tc.err.Number, e.Kind, e.Code, tc.want, tc.err.Number)
		}
	}
	if e := classify(MySQL, mysql.ErrInvalidConn); e.Kind != KindConnection {
		t.Errorf("classify(mysql.ErrInvalidConn) = %s, want connection_loss", e.Kind)
	}
}

// TestClassifyPostgresCodes covers the SQLSTATEs the real server tests do
// not provoke.
func TestClassifyPostgresCodes(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]Kind{
		"40001": KindSerialization, "40P01": KindDeadlock, "55P03": KindLockTimeout, "08006": KindConnection,
		"57P01": KindFailover, "25006": KindFailover, "53300": KindResources, "57014": KindTimeout,
		"42601": KindSyntax, "42501": KindPermission, "42P01": KindMissing, "23503": KindConstraint,
		"22001": KindData, "28P01": KindPermission, "3D000": KindMissing, "XX000": KindOther,
	} {
		e := classify(Postgres, fmt.Errorf("query: %w", &pgconn.PgError{Code: code}))
		if e.Kind != want || e.Code != code {
			t.Errorf("classify(PgError{Code: %s}) = %s, %s; want %s", code, e.Kind, e.Code, want)
		}
	}
}

func TestClassifyGeneric(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want Kind
	}{
		{context.DeadlineExceeded, KindTimeout},
		{driver.ErrBadConn, KindConnection},
		{fmt.Errorf("read: %w", io.EOF), KindConnection},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), KindConnection},
		{errors.New("sql: expected 1 arguments, got 2"), KindInvalid},
		{errors.New("something else"), KindOther},
	} {
		for _, drv := range []string{SQLite, Postgres, SQLServer, MySQL} {
			if e := classify(drv, tc.err); e.Kind != tc.want {
				t.Errorf("classify(%s, %v) = %s, want %s", drv, tc.err, e.Kind, tc.want)
			}
		}
	}
}

func TestReturnsRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		drv, stmt string
		want      bool
	}{
		{SQLite, "SELECT 1", true},
		{SQLite, "  -- a comment\n  select 1", true},
		{Postgres, "WITH a AS (SELECT 1) SELECT * FROM a", true},
		{Postgres, "CALL summarise(1, NULL)", true},
		{Postgres, "VALUES (1), (2)", true},
		{Postgres, "(SELECT 1)", true},
		{Postgres, "INSERT INTO t VALUES ($1)", false},
		{Postgres, "/* lead */ insert into t values (1) returning id", true},
		{Postgres, "UPDATE t SET note = 'returning' WHERE id = 1", false},
		{Postgres, "UPDATE t SET note = $$ returning $$ WHERE id = 1", false},
		{Postgres, "UPDATE t SET note = $x$ returning $x$ WHERE id = 1", false},
		{Postgres, `UPDATE t SET "returning" = 1`, false},
		{Postgres, "DELETE FROM t -- returning\n WHERE a = 1", false},
		{Postgres, "CREATE TABLE t (a int)", false},
		{Postgres, "DO $$ BEGIN PERFORM 1; END $$", true},
		{SQLServer, "INSERT INTO t (a) OUTPUT inserted.id VALUES (@p1)", true},
		{SQLServer, "EXEC dbo.collect @shift = 1", true},
		{SQLServer, "dbo.collect", true},
		{SQLServer, "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET a = 1;", false},
		{SQLServer, "UPDATE [output] SET a = 1", false},
		{MySQL, "INSERT INTO t (output) VALUES (?)", false},
		{MySQL, "REPLACE INTO t VALUES (?)", false},
		{MySQL, "SHOW TABLES", true},
		{MySQL, "UPDATE t SET a = 'it''s returning'", false},
		{MySQL, "UPDATE `returning` SET a = 1", false},
	} {
		if got := returnsRows(tc.drv, tc.stmt); got != tc.want {
			t.Errorf("returnsRows(%s, %q) = %v, want %v", tc.drv, tc.stmt, got, tc.want)
		}
	}
}

// TestPrepareSQLServer checks how a procedure call's arguments, output
// parameters and return status are bound for go-mssqldb.
func TestPrepareSQLServer(t *testing.T) {
	t.Parallel()
	st, err := prepare(SQLServer, wire.SQLPayload{Statement: "dbo.collect_shift\n",
		Args: json.RawMessage(`{"shift": 3, "total": 0, "note": "x"}`), Out: []string{"total", "note"}})
	if err != nil {
		t.Fatal(err)
	}
	if !st.query || st.status == nil || st.text != "dbo.collect_shift" {
		t.Errorf("bare procedure name: query %v, status %v, text %q; want a query of dbo.collect_shift with a return status", st.query, st.status, st.text)
	}
	// shift is an input; total and note outputs, with their initial
	// values' types; the return status last.
	if len(st.args) != 4 {
		t.Fatalf("args = %v, want shift, total, note and the return status", st.args)
	}
	if a := st.args[0].(sql.NamedArg); a.Name != "shift" || a.Value != int64(3) {
		t.Errorf("args[0] = %+v, want shift = 3", a)
	}
	total := st.args[1].(sql.NamedArg)
	if dest, ok := total.Value.(sql.Out).Dest.(*int64); total.Name != "total" || !ok || *dest != 0 {
		t.Errorf("args[1] = %+v, want total as an *int64 output", total)
	}
	if _, ok := st.args[3].(*mssql.ReturnStatus); !ok {
		t.Errorf("args[3] = %T, want *mssql.ReturnStatus", st.args[3])
	}
	// What the driver writes back lands in the result.
	*total.Value.(sql.Out).Dest.(*int64) = 42
	*st.args[2].(sql.NamedArg).Value.(sql.Out).Dest.(*string) = "closed"
	*st.status = 1
	var res wire.SQLResult
	st.outputs(&res)
	if got, want := jsonOf(t, res), `{"out":{"note":"closed","total":42},"return_status":1}`; got != want {
		t.Errorf("result = %s, want %s", got, want)
	}

	// A text statement gets no return status (the server sends none of its
	// own); positional args pass as they are.
	st, err = prepare(SQLServer, wire.SQLPayload{Statement: "UPDATE t SET a = @p1", Args: json.RawMessage(`[1.5]`)})
	if err != nil || st.query || st.status != nil || len(st.args) != 1 || st.args[0] != 1.5 {
		t.Errorf("prepare(UPDATE) = %+v, %v; want an exec with one arg and no status", st, err)
	}
}

func TestPrepareInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		drv  string
		p    wire.SQLPayload
		want string
	}{
		{SQLite, wire.SQLPayload{Statement: "  "}, "statement is empty"},
		{SQLite, wire.SQLPayload{Statement: "SELECT 1", MaxRows: -1}, "max_rows -1"},
		{SQLite, wire.SQLPayload{Statement: "SELECT 1", Timeout: "soon"}, `timeout "soon"`},
		{Postgres, wire.SQLPayload{Statement: "SELECT 1", Out: []string{"x"}}, "out parameters are a SQL Server feature"},
		{SQLServer, wire.SQLPayload{Statement: "p", Args: json.RawMessage(`[1]`), Out: []string{"x"}}, "need named args"},
		{SQLServer, wire.SQLPayload{Statement: "p", Out: []string{"x;drop"}}, `out "x;drop"`},
		{MySQL, wire.SQLPayload{Statement: "SELECT :a", Args: json.RawMessage(`{"a": 1}`)}, "no named parameters"},
		{SQLite, wire.SQLPayload{Statement: "SELECT ?", Args: json.RawMessage(`[1e999]`)}, "out of range"},
		{SQLite, wire.SQLPayload{Statement: "SELECT ?", Args: json.RawMessage(`{"": 1}`)}, `name ""`},
		{SQLite, wire.SQLPayload{Statement: "SELECT :1a", Args: json.RawMessage(`{"1a": 1}`)}, `name "1a"`},
	} {
		_, err := prepare(tc.drv, tc.p)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindInvalid || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("prepare(%s, %+v) = %v, want an invalid error mentioning %q", tc.drv, tc.p, err, tc.want)
		}
	}
	// Arrays and objects bind as their JSON text.
	st, err := prepare(Postgres, wire.SQLPayload{Statement: "SELECT $1, $2, $3", Args: json.RawMessage(`[{"a":1}, [1,2], 9007199254740993]`)})
	if err != nil || st.args[0] != `{"a":1}` || st.args[1] != "[1,2]" || st.args[2] != int64(9007199254740993) {
		t.Errorf("prepare(json args) = %#v, %v; want JSON text and an exact int64", st.args, err)
	}
}

func TestNewChecksDrivers(t *testing.T) {
	t.Parallel()
	const pw = "s3cret-pw"
	for _, tc := range []struct {
		db   Database
		want string
	}{
		{Database{Name: "a", Driver: "oracle", DSN: "x"}, `driver "oracle"`},
		{Database{Name: "a", Driver: SQLite}, "empty DSN"},
		{Database{Name: "a", Driver: SQLite, DSN: "x", MaxOpen: -1}, "max_open -1"},
		{Database{Name: "a", Driver: MySQL, DSN: "gantry:" + pw + "@tcp(127.0.0.1:3306)/plant?badparam=%zz"}, "mysql dsn"},
		{Database{Name: "a", Driver: SQLServer, DSN: "sqlserver://gantry:" + pw + "@127.0.0.1:notaport?database=plant"}, "sqlserver dsn"},
	} {
		_, err := New([]Database{tc.db})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), pw) {
			t.Errorf("New(%s, %s) = %v, want an error mentioning %q without the password", tc.db.Driver, tc.db.Name, err, tc.want)
		}
	}
	// Valid DSNs of every driver: nothing connects yet.
	d, err := New([]Database{
		{Name: "lite", Driver: SQLite, DSN: "file:plant.db"},
		{Name: "pg", Driver: Postgres, DSN: "postgres://gantry:" + pw + "@127.0.0.1:1/plant"},
		{Name: "ms", Driver: SQLServer, DSN: "sqlserver://gantry:" + pw + "@127.0.0.1:1?database=plant"},
		{Name: "my", Driver: MySQL, DSN: "gantry:" + pw + "@tcp(127.0.0.1:1)/plant"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Run(context.Background(), wire.SQLPayload{DB: "lite", Statement: "SELECT 1"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if _, err := New([]Database{{Name: "a", Driver: SQLite, DSN: "x"}, {Name: "a", Driver: SQLite, DSN: "y"}}); err == nil {
		t.Error("New with a name twice = nil, want an error")
	}
}

func TestScrub(t *testing.T) {
	t.Parallel()
	pw := "p@ss w/rd"
	dsn := "postgres://gantry:p%40ss%20w%2Frd@db:5432/plant"
	sec := secretsOf(dsn, pw)
	for _, msg := range []string{
		"cannot parse `" + dsn + "`: bad port",
		"password=" + pw + " rejected",
		"url has p%40ss+w%2Frd in it",
		"url has p%40ss%20w%2Frd in it",
		"userinfo p@ss%20w%2Frd",
	} {
		got := scrub(msg, sec)
		if strings.Contains(got, "ss w/rd") || strings.Contains(got, "%40ss") || strings.Contains(got, "ss%20w") || !strings.Contains(got, wire.Redacted) {
			t.Errorf("scrub(%q) = %q, want the password and DSN replaced by %s", msg, got, wire.Redacted)
		}
	}
	if got := scrub("a b c", secretsOf("x", "ab")); got != "a b c" {
		t.Errorf("scrub with a 1-letter DSN and a 2-letter password = %q, want the text unchanged", got)
	}
}
