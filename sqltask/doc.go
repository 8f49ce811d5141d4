// Package sqltask runs sql tasks: one statement, or a SQL Server stored
// procedure, against a database of the config file's databases, through
// database/sql with the database's own driver — SQLite (modernc.org/sqlite,
// pure Go), PostgreSQL (pgx), SQL Server (go-mssqldb) and MySQL
// (go-sql-driver/mysql).
//
// A Databases holds one bounded pool per database, opened on first use.
// Arguments are always bound as parameters. A cancelled context cancels the
// statement on the server: pgx sends a cancel request, go-mssqldb an
// attention packet, SQLite is interrupted, and MySQL gets a KILL QUERY for
// the connection's thread.
//
// Errors are classified by the driver's own error code (SQLSTATE, error
// number, result code) into a Kind: deadlock, serialization failure, lock
// timeout, connection loss, failover and exhausted resources are retried;
// syntax, permission, missing object, constraint and data errors are
// permanent. An error's text never holds the database's DSN or password.
// See docs/sql.md.
package sqltask
