package sqltask

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	mssql "github.com/microsoft/go-mssqldb"
	"github.com/microsoft/go-mssqldb/msdsn"
	"modernc.org/sqlite"

	"github.com/gantry-dev/gantry/broker/wire"
)

// The drivers a database can name.
const (
	SQLite    = wire.DriverSQLite
	Postgres  = wire.DriverPostgres
	SQLServer = wire.DriverSQLServer
	MySQL     = wire.DriverMySQL
)

// DefaultMaxOpen is a database's pool size when its MaxOpen is 0.
const DefaultMaxOpen = 4

// DefaultMaxRows is how many rows of a result set a result keeps when the
// payload's max_rows is 0.
const DefaultMaxRows = 100

// MaxResultBytes bounds the encoded rows of a result; rows past it are left
// out and the result says it is truncated.
const MaxResultBytes = 64 << 10

// ErrClosed is returned by Run once Close has been called.
var ErrClosed = errors.New("databases closed")

// Database is a database sql tasks may use.
type Database struct {
	// Name is what a task's payload names in db.
	Name string
	// Driver is SQLite, Postgres, SQLServer or MySQL.
	Driver string
	// DSN is the driver's data source name. It may hold a password: it and
	// the password in it never appear in an error.
	DSN string
	// MaxOpen bounds the connections of the database's pool. Defaults to
	// DefaultMaxOpen.
	MaxOpen int
}

// Databases holds one bounded pool per database, opened on first use.
// Its methods are safe for concurrent use.
type Databases struct {
	mu     sync.Mutex
	dbs    map[string]*database
	closed bool
}

// database is one configured database.
type database struct {
	name    string
	driver  string
	maxOpen int
	// connector opens connections; pool is opened from it on first use.
	connector driver.Connector
	pool      *sql.DB
	// secrets are the strings an error must not show: the DSN, its
	// password and their escaped forms.
	secrets []string
}

// New checks every database's driver and DSN; it connects to none of them.
func New(dbs []Database) (*Databases, error) {
	d := &Databases{dbs: make(map[string]*database, len(dbs))}
	for i, db := range dbs {
		if db.Name == "" {
			return nil, fmt.Errorf("databases[%d]: no name", i)
		}
		if _, dup := d.dbs[db.Name]; dup {
			return nil, fmt.Errorf("database %s: listed twice", db.Name)
		}
		if db.MaxOpen < 0 {
			return nil, fmt.Errorf("database %s: max_open %d: want 0 (the default, %d) or more", db.Name, db.MaxOpen, DefaultMaxOpen)
		}
		if db.DSN == "" {
			return nil, fmt.Errorf("database %s: empty DSN", db.Name)
		}
		conn, password, err := connector(db.Driver, db.DSN)
		sec := secretsOf(db.DSN, password)
		if err != nil {
			return nil, fmt.Errorf("database %s: %s", db.Name, scrub(err.Error(), sec))
		}
		d.dbs[db.Name] = &database{name: db.Name, driver: db.Driver, maxOpen: cmp.Or(db.MaxOpen, DefaultMaxOpen),
			connector: conn, secrets: sec}
	}
	return d, nil
}

// connector parses dsn for drv and returns a connector and the password it
// holds.
func connector(drv, dsn string) (driver.Connector, string, error) {
	switch drv {
	case SQLite:
		return sqliteConnector{dsn: sqliteDSN(dsn)}, "", nil
	case Postgres:
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, "", fmt.Errorf("postgres dsn: %w", err)
		}
		// A cancelled context sends a cancel request at once: the statement
		// stops on the server with query_canceled (57014) and the
		// connection stays usable. pgx's default breaks the connection and
		// sends the cancel from a goroutine that outlives the call.
		cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
		}
		// Without a statement cache, a table altered between two runs does
		// not fail the next one with "cached plan must not change result
		// type".
		if !strings.Contains(dsn, "default_query_exec_mode") {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
		}
		if _, ok := cfg.RuntimeParams["application_name"]; !ok {
			cfg.RuntimeParams["application_name"] = "gantry"
		}
		return stdlib.GetConnector(*cfg), cfg.Password, nil
	case SQLServer:
		cfg, err := msdsn.Parse(dsn)
		if err != nil {
			return nil, "", fmt.Errorf("sqlserver dsn: %w", err)
		}
		return mssql.NewConnectorConfig(cfg), cfg.Password, nil
	case MySQL:
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, "", fmt.Errorf("mysql dsn: %w", err)
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, "", fmt.Errorf("mysql dsn: %w", err)
		}
		return conn, cfg.Passwd, nil
	}
	return nil, "", fmt.Errorf("driver %q: want %s, %s, %s or %s", drv, SQLite, Postgres, SQLServer, MySQL)
}

// sqliteConnector opens modernc.org/sqlite connections.
type sqliteConnector struct{ dsn string }

// Connect opens a connection to the SQLite file.
func (c sqliteConnector) Connect(context.Context) (driver.Conn, error) {
	return (&sqlite.Driver{}).Open(c.dsn)
}

// Driver returns modernc.org/sqlite's driver.
func (c sqliteConnector) Driver() driver.Driver { return &sqlite.Driver{} }

// sqliteDSN adds a busy timeout of 5 s to a SQLite DSN that sets none, so
// that a writer waits for another's lock instead of failing at once.
func sqliteDSN(dsn string) string {
	if strings.Contains(dsn, "busy_timeout") {
		return dsn
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "_pragma=busy_timeout(5000)"
}

// pool returns the pool of database name, opening it on first use.
func (d *Databases) pool(name string) (*database, *sql.DB, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, nil, ErrClosed
	}
	db, ok := d.dbs[name]
	if !ok {
		return nil, nil, invalidf("db %q is not among this worker's databases (the config file's databases)", name)
	}
	if db.pool == nil {
		db.pool = sql.OpenDB(db.connector)
		db.pool.SetMaxOpenConns(db.maxOpen)
		db.pool.SetMaxIdleConns(db.maxOpen)
		db.pool.SetConnMaxIdleTime(5 * time.Minute)
	}
	return db, db.pool, nil
}

// Close closes every pool; Run fails with ErrClosed from then on.
func (d *Databases) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	var errs []error
	for _, db := range d.dbs {
		if db.pool == nil {
			continue
		}
		if err := db.pool.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close database %s: %s", db.name, scrub(err.Error(), db.secrets)))
		}
		db.pool = nil
	}
	return errors.Join(errs...)
}

// errStatementTimeout is the cause of a statement's context when the
// payload's timeout ran out.
var errStatementTimeout = errors.New("statement timed out")

// Run runs the statement of p and returns its result. An error is an
// *Error (its Permanent method says whether a retry can help) or
// ErrClosed; its text never holds the database's DSN or password.
func (d *Databases) Run(ctx context.Context, p wire.SQLPayload) (wire.SQLResult, error) {
	db, pool, err := d.pool(p.DB)
	if err != nil {
		return wire.SQLResult{}, err
	}
	st, err := prepare(db.driver, p)
	if err != nil {
		return wire.SQLResult{}, err
	}
	if st.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, st.timeout, errStatementTimeout)
		defer cancel()
	}
	res, err := db.run(ctx, pool, st)
	if err != nil {
		e := classify(db.driver, err)
		e.DB = db.name
		msg := scrub(err.Error(), db.secrets)
		if errors.Is(context.Cause(ctx), errStatementTimeout) {
			e.Kind = KindTimeout
			msg = fmt.Sprintf("statement timed out after %v: %s", st.timeout, msg)
		}
		e.msg = "db " + db.name + ": " + msg
		return wire.SQLResult{}, e
	}
	return res, nil
}

// conn is what a statement runs on: a connection or a transaction.
type conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// run runs st on a connection of pool, in a transaction if asked.
func (db *database) run(ctx context.Context, pool *sql.DB, st statement) (res wire.SQLResult, err error) {
	c, err := pool.Conn(ctx)
	if err != nil {
		return res, err
	}
	defer c.Close()
	if db.driver == MySQL {
		stop, err := killOnCancel(ctx, db.connector, c)
		if err != nil {
			return res, err
		}
		defer stop()
	}
	var on conn = c
	var tx *sql.Tx
	if st.tx {
		if tx, err = c.BeginTx(ctx, nil); err != nil {
			return res, err
		}
		defer func() {
			if err != nil {
				_ = tx.Rollback()
			}
		}()
		on = tx
	}
	if st.query {
		res, err = query(ctx, on, st)
	} else {
		res, err = exec(ctx, on, st)
	}
	if err != nil {
		return res, err
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return wire.SQLResult{}, err
		}
	}
	st.outputs(&res)
	return res, nil
}

// exec runs a statement for its effect.
func exec(ctx context.Context, on conn, st statement) (wire.SQLResult, error) {
	r, err := on.ExecContext(ctx, st.text, st.args...)
	if err != nil {
		return wire.SQLResult{}, err
	}
	var res wire.SQLResult
	if n, err := r.RowsAffected(); err == nil {
		res.RowsAffected = &n
	}
	return res, nil
}

// killOnCancel makes a cancelled ctx kill the statement running on MySQL
// connection c: the driver only closes its socket, and the server would run
// the statement to its end. The kill goes through a connection of its own,
// outside the pool (which c may fill). The returned function stops the
// watch and waits for a kill under way, so that c never goes back to the
// pool while a KILL QUERY for its thread may still come.
func killOnCancel(ctx context.Context, connector driver.Connector, c *sql.Conn) (func(), error) {
	var id int64
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kc, err := connector.Connect(kctx)
		if err != nil {
			return
		}
		defer kc.Close()
		if ex, ok := kc.(driver.ExecerContext); ok {
			// id is a number the server gave: nothing to bind or quote.
			_, _ = ex.ExecContext(kctx, fmt.Sprintf("KILL QUERY %d", id), nil)
		}
	})
	return func() {
		if !stop() {
			<-done
		}
	}, nil
}
