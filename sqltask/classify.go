package sqltask

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	mssql "github.com/microsoft/go-mssqldb"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Kind is what a database error means, and so whether a retry can help.
type Kind string

// The kinds of database errors. The first ones are retried with backoff;
// from KindSyntax on they are permanent (NEEDS_REVIEW at once). An error
// no table knows is KindOther, and retried up to the task's attempts.
const (
	KindDeadlock      Kind = "deadlock"
	KindSerialization Kind = "serialization_failure"
	KindLockTimeout   Kind = "lock_timeout"
	KindConnection    Kind = "connection_loss"
	KindFailover      Kind = "failover"
	KindResources     Kind = "resources"
	KindTimeout       Kind = "timeout"
	KindOther         Kind = "other"

	KindSyntax     Kind = "syntax"
	KindPermission Kind = "permission"
	KindMissing    Kind = "missing_object"
	KindConstraint Kind = "constraint"
	KindData       Kind = "data"
	// KindRaised is an error the statement raised itself: RAISE
	// EXCEPTION, RAISERROR or THROW, SIGNAL.
	KindRaised Kind = "raised"
	// KindInvalid is a payload or binding that cannot run: bad args, a
	// feature the driver lacks, an unknown db, a corrupt database file.
	KindInvalid Kind = "invalid"
)

// Retryable reports whether an error of kind k may go away on a retry.
func (k Kind) Retryable() bool {
	switch k {
	case KindDeadlock, KindSerialization, KindLockTimeout, KindConnection, KindFailover, KindResources, KindTimeout, KindOther:
		return true
	}
	return false
}

// Error is a classified error of a sql task. Its text names the database
// and holds neither its DSN nor its password.
type Error struct {
	// DB is the database's name.
	DB string
	// Code is the driver's error code: a SQLSTATE (postgres, mysql), an
	// error number (sqlserver, mysql) or a result code (sqlite); empty when
	// the error has none.
	Code string
	Kind Kind
	msg  string
}

// Error names the database and gives the driver's message, scrubbed.
func (e *Error) Error() string { return e.msg }

// Permanent reports whether a retry cannot help: workers send the task to
// NEEDS_REVIEW at once.
func (e *Error) Permanent() bool { return !e.Kind.Retryable() }

// invalidf is a KindInvalid error.
func invalidf(format string, args ...any) *Error {
	return &Error{Kind: KindInvalid, msg: fmt.Sprintf(format, args...)}
}

// classify sorts a driver's error by its code. The message is left for the
// caller to set, scrubbed.
func classify(drv string, err error) *Error {
	var code string
	kind := KindOther
	switch drv {
	case Postgres:
		code, kind = classifyPostgres(err)
	case SQLServer:
		code, kind = classifySQLServer(err)
	case MySQL:
		code, kind = classifyMySQL(err)
	case SQLite:
		code, kind = classifySQLite(err)
	}
	if kind == KindOther {
		kind = classifyGeneric(err)
	}
	return &Error{Code: code, Kind: kind}
}

// classifyGeneric sorts errors without a driver's code.
func classifyGeneric(err error) Kind {
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return KindTimeout
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, mysql.ErrInvalidConn), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.As(err, &netErr):
		return KindConnection
	}
	// database/sql and pgx check the argument count before anything runs.
	msg := err.Error()
	for _, s := range []string{"sql: expected ", "sql: converting argument", "arguments, got ", "named args not supported",
		"mysql: driver does not support the use of Named Parameters"} {
		if strings.Contains(msg, s) {
			return KindInvalid
		}
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return KindConnection
	}
	return KindOther
}

// postgresCodes are the SQLSTATEs with a kind of their own; the others go
// by their class (the first two characters) in postgresClasses.
var postgresCodes = map[string]Kind{
	"40001": KindSerialization, // serialization_failure
	"40P01": KindDeadlock,      // deadlock_detected
	"40003": KindConnection,    // statement_completion_unknown
	"55P03": KindLockTimeout,   // lock_not_available
	"55006": KindLockTimeout,   // object_in_use
	"57014": KindTimeout,       // query_canceled (statement_timeout, a cancel)
	"57P01": KindFailover,      // admin_shutdown
	"57P02": KindFailover,      // crash_shutdown
	"57P03": KindFailover,      // cannot_connect_now
	"57P05": KindConnection,    // idle_session_timeout
	"25006": KindFailover,      // read_only_sql_transaction: a standby
	"72000": KindSerialization, // snapshot_too_old
	"42501": KindPermission,    // insufficient_privilege
	"42P01": KindMissing,       // undefined_table
	"42703": KindMissing,       // undefined_column
	"42883": KindMissing,       // undefined_function
	"42704": KindMissing,       // undefined_object
	"42P02": KindMissing,       // undefined_parameter
	"3D000": KindMissing,       // invalid_catalog_name
	"3F000": KindMissing,       // invalid_schema_name
	"0A000": KindInvalid,       // feature_not_supported
}

var postgresClasses = map[string]Kind{
	"08": KindConnection,    // connection_exception
	"40": KindSerialization, // transaction_rollback
	"53": KindResources,     // insufficient_resources
	"57": KindFailover,      // operator_intervention
	"58": KindConnection,    // system_error (I/O)
	"42": KindSyntax,        // syntax_error_or_access_rule_violation
	"23": KindConstraint,    // integrity_constraint_violation
	"22": KindData,          // data_exception
	"28": KindPermission,    // invalid_authorization_specification
	"P0": KindRaised,        // plpgsql_error: RAISE EXCEPTION, ASSERT
	"21": KindData,          // cardinality_violation
	"26": KindInvalid,       // invalid_sql_statement_name
	"2B": KindConstraint,    // dependent_privilege_descriptors_still_exist
	"2F": KindRaised,        // sql_routine_exception
	"38": KindRaised,        // external_routine_exception
	"39": KindRaised,        // external_routine_invocation_exception
	"44": KindConstraint,    // with_check_option_violation
}

func classifyPostgres(err error) (string, Kind) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return "", KindOther
	}
	if k, ok := postgresCodes[pe.Code]; ok {
		return pe.Code, k
	}
	if len(pe.Code) == 5 {
		if k, ok := postgresClasses[pe.Code[:2]]; ok {
			return pe.Code, k
		}
	}
	return pe.Code, KindOther
}

// sqlServerNumbers are the SQL Server error numbers with a kind; an unknown
// number of severity 20 or more broke the connection.
var sqlServerNumbers = map[int32]Kind{
	1205:  KindDeadlock,      // chosen as deadlock victim
	3960:  KindSerialization, // snapshot isolation update conflict
	3961:  KindSerialization, // snapshot isolation: object changed
	1222:  KindLockTimeout,   // lock request time out period exceeded
	233:   KindConnection,    // no process on the other end of the pipe
	64:    KindConnection,    // specified network name no longer available
	121:   KindConnection,    // semaphore timeout
	10053: KindConnection,    // connection aborted by the host
	10054: KindConnection,    // connection reset by peer
	10060: KindConnection,    // connection attempt timed out
	4060:  KindFailover,      // cannot open database (unavailable while failing over)
	40613: KindFailover,      // database not currently available (Azure)
	40197: KindFailover,      // service error processing the request (Azure)
	40143: KindFailover,      // connection could not be initialized (Azure)
	976:   KindFailover,      // availability group replica not accessible
	978:   KindFailover,      // availability group: read-only routing
	983:   KindFailover,      // availability database not accessible
	3906:  KindFailover,      // database is read-only (a secondary)
	40501: KindResources,     // service busy (Azure)
	49918: KindResources,     // not enough resources (Azure)
	49919: KindResources,     // too many operations (Azure)
	49920: KindResources,     // too many operations (Azure)
	10928: KindResources,     // resource limit reached (Azure)
	10929: KindResources,     // resource limit reached (Azure)
	701:   KindResources,     // insufficient system memory
	1204:  KindResources,     // cannot obtain a lock resource
	9002:  KindResources,     // transaction log full
	1105:  KindResources,     // filegroup full
	102:   KindSyntax,        // incorrect syntax near
	105:   KindSyntax,        // unclosed quotation mark
	156:   KindSyntax,        // incorrect syntax near keyword
	170:   KindSyntax,        // incorrect syntax
	137:   KindSyntax,        // must declare the scalar variable
	8144:  KindSyntax,        // procedure has too many arguments
	201:   KindSyntax,        // procedure expects a parameter not supplied
	207:   KindMissing,       // invalid column name
	208:   KindMissing,       // invalid object name
	2812:  KindMissing,       // could not find stored procedure
	4121:  KindMissing,       // cannot find function
	911:   KindMissing,       // database does not exist
	229:   KindPermission,    // permission denied on object
	230:   KindPermission,    // permission denied on column
	262:   KindPermission,    // permission denied in database
	297:   KindPermission,    // user has no permission
	300:   KindPermission,    // permission denied on object
	916:   KindPermission,    // cannot access the database
	18456: KindPermission,    // login failed
	2627:  KindConstraint,    // primary key or unique constraint violation
	2601:  KindConstraint,    // duplicate key in unique index
	547:   KindConstraint,    // foreign key or check constraint conflict
	515:   KindConstraint,    // cannot insert NULL
	245:   KindData,          // conversion failed
	241:   KindData,          // conversion of date/time failed
	242:   KindData,          // date/time out of range
	220:   KindData,          // arithmetic overflow for data type
	232:   KindData,          // arithmetic overflow for type
	8114:  KindData,          // error converting data type
	8115:  KindData,          // arithmetic overflow converting
	8134:  KindData,          // divide by zero
	8152:  KindData,          // string or binary data would be truncated
	2628:  KindData,          // string or binary data would be truncated in column
	50000: KindRaised,        // RAISERROR with a message
}

func classifySQLServer(err error) (string, Kind) {
	var me mssql.Error
	if !errors.As(err, &me) {
		var se mssql.StreamError
		if errors.As(err, &se) {
			return "", KindConnection
		}
		return "", KindOther
	}
	code := strconv.Itoa(int(me.Number))
	if k, ok := sqlServerNumbers[me.Number]; ok {
		return code, k
	}
	switch {
	case me.Number > 50000:
		return code, KindRaised // THROW with a user number
	case me.Class >= 20:
		return code, KindConnection
	}
	return code, KindOther
}

// mySQLNumbers are the MySQL error numbers with a kind; the others go by
// their SQLSTATE's class in mySQLClasses.
var mySQLNumbers = map[uint16]Kind{
	1213: KindDeadlock,    // ER_LOCK_DEADLOCK
	1205: KindLockTimeout, // ER_LOCK_WAIT_TIMEOUT
	3572: KindLockTimeout, // ER_LOCK_NOWAIT
	1053: KindFailover,    // ER_SERVER_SHUTDOWN
	1290: KindFailover,    // ER_OPTION_PREVENTS_STATEMENT (--read-only)
	1792: KindFailover,    // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	1836: KindFailover,    // ER_READ_ONLY_MODE
	1927: KindConnection,  // ER_CONNECTION_KILLED
	1152: KindConnection,  // ER_ABORTING_CONNECTION
	1158: KindConnection,  // ER_NET_READ_ERROR
	1159: KindConnection,  // ER_NET_READ_INTERRUPTED
	1160: KindConnection,  // ER_NET_ERROR_ON_WRITE
	1161: KindConnection,  // ER_NET_WRITE_INTERRUPTED
	1040: KindResources,   // ER_CON_COUNT_ERROR: too many connections
	1041: KindResources,   // ER_OUT_OF_RESOURCES
	1021: KindResources,   // ER_DISK_FULL
	1114: KindResources,   // ER_RECORD_FILE_FULL
	1637: KindResources,   // ER_TOO_MANY_CONCURRENT_TRXS
	1317: KindTimeout,     // ER_QUERY_INTERRUPTED (KILL QUERY)
	3024: KindTimeout,     // ER_QUERY_TIMEOUT (max_execution_time)
	1064: KindSyntax,      // ER_PARSE_ERROR
	1149: KindSyntax,      // ER_SYNTAX_ERROR
	1065: KindSyntax,      // ER_EMPTY_QUERY
	1210: KindSyntax,      // ER_WRONG_ARGUMENTS
	1318: KindSyntax,      // ER_SP_WRONG_NO_OF_ARGS
	1146: KindMissing,     // ER_NO_SUCH_TABLE
	1054: KindMissing,     // ER_BAD_FIELD_ERROR
	1305: KindMissing,     // ER_SP_DOES_NOT_EXIST
	1049: KindMissing,     // ER_BAD_DB_ERROR
	1051: KindMissing,     // ER_BAD_TABLE_ERROR
	1044: KindPermission,  // ER_DBACCESS_DENIED_ERROR
	1045: KindPermission,  // ER_ACCESS_DENIED_ERROR
	1142: KindPermission,  // ER_TABLEACCESS_DENIED_ERROR
	1143: KindPermission,  // ER_COLUMNACCESS_DENIED_ERROR
	1227: KindPermission,  // ER_SPECIFIC_ACCESS_DENIED_ERROR
	1370: KindPermission,  // ER_PROCACCESS_DENIED_ERROR
	1062: KindConstraint,  // ER_DUP_ENTRY
	1451: KindConstraint,  // ER_ROW_IS_REFERENCED_2
	1452: KindConstraint,  // ER_NO_REFERENCED_ROW_2
	1048: KindConstraint,  // ER_BAD_NULL_ERROR
	3819: KindConstraint,  // ER_CHECK_CONSTRAINT_VIOLATED
	1264: KindData,        // ER_WARN_DATA_OUT_OF_RANGE
	1265: KindData,        // WARN_DATA_TRUNCATED
	1292: KindData,        // ER_TRUNCATED_WRONG_VALUE
	1366: KindData,        // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD
	1406: KindData,        // ER_DATA_TOO_LONG
	1365: KindData,        // ER_DIVISION_BY_ZERO
	1690: KindData,        // ER_DATA_OUT_OF_RANGE
	3140: KindData,        // ER_INVALID_JSON_TEXT
	1644: KindRaised,      // ER_SIGNAL_EXCEPTION (SIGNAL SQLSTATE '45000')
}

var mySQLClasses = map[string]Kind{
	"40": KindSerialization,
	"08": KindConnection,
	"42": KindSyntax,
	"23": KindConstraint,
	"22": KindData,
	"28": KindPermission,
}

func classifyMySQL(err error) (string, Kind) {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return "", KindOther
	}
	code := strconv.Itoa(int(me.Number))
	if k, ok := mySQLNumbers[me.Number]; ok {
		return code, k
	}
	if k, ok := mySQLClasses[string(me.SQLState[:2])]; ok {
		return code, k
	}
	return code, KindOther
}

// sqliteCodes are the kinds of SQLite's primary result codes.
var sqliteCodes = map[int]Kind{
	sqlite3.SQLITE_BUSY:       KindLockTimeout,
	sqlite3.SQLITE_LOCKED:     KindLockTimeout,
	sqlite3.SQLITE_INTERRUPT:  KindTimeout,
	sqlite3.SQLITE_IOERR:      KindConnection,
	sqlite3.SQLITE_CANTOPEN:   KindConnection,
	sqlite3.SQLITE_PROTOCOL:   KindConnection,
	sqlite3.SQLITE_FULL:       KindResources,
	sqlite3.SQLITE_NOMEM:      KindResources,
	sqlite3.SQLITE_SCHEMA:     KindSerialization,
	sqlite3.SQLITE_CONSTRAINT: KindConstraint,
	sqlite3.SQLITE_MISMATCH:   KindData,
	sqlite3.SQLITE_RANGE:      KindData,
	sqlite3.SQLITE_TOOBIG:     KindData,
	sqlite3.SQLITE_READONLY:   KindPermission,
	sqlite3.SQLITE_PERM:       KindPermission,
	sqlite3.SQLITE_AUTH:       KindPermission,
	sqlite3.SQLITE_CORRUPT:    KindInvalid,
	sqlite3.SQLITE_NOTADB:     KindInvalid,
	sqlite3.SQLITE_FORMAT:     KindInvalid,
}

func classifySQLite(err error) (string, Kind) {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return "", KindOther
	}
	code := strconv.Itoa(se.Code())
	primary := se.Code() & 0xff
	if k, ok := sqliteCodes[primary]; ok {
		return code, k
	}
	if primary == sqlite3.SQLITE_ERROR {
		// SQLITE_ERROR is any error in the SQL: tell a missing object
		// from the rest by its message.
		if msg := se.Error(); strings.Contains(msg, "no such ") {
			return code, KindMissing
		}
		return code, KindSyntax
	}
	return code, KindOther
}
