package config

import (
	"fmt"
	"os"
	"strings"

	"github.com/gantry-dev/gantry/broker/wire"
)

// validate checks database i: its name, driver, DSN source and pool size.
// Where the DSN comes from is checked here; the DSN itself when the
// workers start (ResolveDSN, sqltask.New), since it may hold a password
// no error should repeat.
func (d Database) validate(i int) error {
	if !routeID.MatchString(d.Name) {
		return fmt.Errorf("databases[%d]: name %q must be letters, digits, '-' or '_'", i, d.Name)
	}
	if !wire.ValidDriver(d.Driver) {
		return fmt.Errorf("databases[%d] (%s): driver %q: want %s, %s, %s or %s", i, d.Name, d.Driver,
			wire.DriverSQLite, wire.DriverPostgres, wire.DriverSQLServer, wire.DriverMySQL)
	}
	n := 0
	for _, s := range []string{d.DSN, d.DSNEnv, d.DSNFile} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("databases[%d] (%s): want exactly one of dsn, dsn_env and dsn_file", i, d.Name)
	}
	if d.MaxOpen < 0 {
		return fmt.Errorf("databases[%d] (%s): max_open %d: want 0 (the default) or more", i, d.Name, d.MaxOpen)
	}
	return nil
}

// ResolveDSN returns the database's DSN: as written, from the environment
// variable DSNEnv, or from the file DSNFile. Its errors say where the DSN
// was looked for, never what it holds; they wrap ErrInvalid.
func (d Database) ResolveDSN() (string, error) {
	switch {
	case d.DSNEnv != "":
		v := strings.TrimSpace(os.Getenv(d.DSNEnv))
		if v == "" {
			return "", fmt.Errorf("%w: database %s: environment variable %s (dsn_env) is not set", ErrInvalid, d.Name, d.DSNEnv)
		}
		return v, nil
	case d.DSNFile != "":
		data, err := os.ReadFile(d.DSNFile)
		if err != nil {
			return "", fmt.Errorf("%w: database %s: dsn_file: %w", ErrInvalid, d.Name, err)
		}
		v := strings.TrimSpace(string(data))
		if v == "" {
			return "", fmt.Errorf("%w: database %s: dsn_file %s is empty", ErrInvalid, d.Name, d.DSNFile)
		}
		return v, nil
	}
	return d.DSN, nil
}
