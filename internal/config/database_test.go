package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDatabaseSection(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "gantry.yaml")
	doc := `databases:
  - {name: plant, driver: sqlite, dsn: "file:plant.db"}
  - {name: office, driver: postgres, dsn_file: secrets/office.dsn, max_open: 2}
  - {name: erp, driver: sqlserver, dsn_env: GANTRY_TEST_UNSET_DSN}
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	const dsn = "postgres://gantry:s3cret@db.local/office"
	if err := os.WriteFile(filepath.Join(dir, "secrets", "office.dsn"), []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Databases; len(got) != 3 || got[1].MaxOpen != 2 || got[1].DSNFile != filepath.Join(dir, "secrets", "office.dsn") {
		t.Fatalf("databases = %+v, want 3, office's dsn_file relative to the config file", got)
	}
	if got, err := f.Databases[0].ResolveDSN(); err != nil || got != "file:plant.db" {
		t.Errorf("ResolveDSN(dsn) = %q, %v; want file:plant.db", got, err)
	}
	if got, err := f.Databases[1].ResolveDSN(); err != nil || got != dsn {
		t.Errorf("ResolveDSN(dsn_file) = %q, %v; want the file's DSN, trimmed", got, err)
	}
	if _, err := f.Databases[2].ResolveDSN(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "GANTRY_TEST_UNSET_DSN") {
		t.Errorf("ResolveDSN(unset dsn_env) = %v, want ErrInvalid naming the variable", err)
	}
	missing := Database{Name: "x", DSNFile: filepath.Join(dir, "nope")}
	if _, err := missing.ResolveDSN(); !errors.Is(err, ErrInvalid) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ResolveDSN(missing dsn_file) = %v, want ErrInvalid and ErrNotExist", err)
	}

	for _, tc := range []struct{ name, doc, want string }{
		{"no name", "databases: [{driver: sqlite, dsn: x}]\n", `name "" must be`},
		{"bad name", "databases: [{name: 'a b', driver: sqlite, dsn: x}]\n", `name "a b" must be`},
		{"duplicate", "databases: [{name: a, driver: sqlite, dsn: x}, {name: a, driver: sqlite, dsn: y}]\n", `duplicate name "a"`},
		{"driver", "databases: [{name: a, driver: oracle, dsn: x}]\n", `driver "oracle": want sqlite, postgres, sqlserver or mysql`},
		{"no dsn", "databases: [{name: a, driver: sqlite}]\n", "exactly one of dsn, dsn_env and dsn_file"},
		{"two dsns", "databases: [{name: a, driver: sqlite, dsn: x, dsn_env: Y}]\n", "exactly one of dsn, dsn_env and dsn_file"},
		{"max_open", "databases: [{name: a, driver: sqlite, dsn: x, max_open: -1}]\n", "max_open -1"},
		{"unknown key", "databases: [{name: a, driver: sqlite, dsn: x, pool: 3}]\n", `unknown key "pool"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.doc))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}
