package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseExample(t *testing.T) {
	t.Parallel()
	f, err := Load(filepath.Join("..", "..", "examples", "gantry.yaml"))
	if err != nil {
		t.Fatalf("Load(examples/gantry.yaml) = %v", err)
	}
	if len(f.Jobs) == 0 {
		t.Errorf("example has no jobs, want at least one so `make run` does something")
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(`
routes:
  - {id: office, proxy: direct, probe_url: "https://example.com/", interval: 30s}
resources:
  - {id: cam1, route: office}
databases:
  - {name: plant, driver: sqlite, dsn: "file:plant.db"}
jobs:
  - {name: tick, type: noop, every: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.Routes[0].Interval.Std(), 30*time.Second; got != want {
		t.Errorf("Interval = %v, want %v", got, want)
	}
	if got, want := f.Jobs[0].Every.Std(), time.Minute; got != want {
		t.Errorf("Every = %v, want %v", got, want)
	}
	if got, want := f.Resources[0].Route, "office"; got != want {
		t.Errorf("Route = %q, want %q", got, want)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown top key", "routez: []\n", `line 1: unknown key "routez"`},
		{"unknown nested key", "jobs:\n  - {name: a, type: noop, evry: 1m}\n", `unknown key "evry"`},
		{"bad duration", "jobs:\n  - {name: a, type: noop, every: soon}\n", `"soon" is not a duration`},
		{"dup resource", "resources: [{id: a}, {id: a}]\n", `duplicate id "a"`},
		{"unknown route", "resources: [{id: a, route: nowhere}]\n", `route "nowhere" is not among routes`},
		{"job without type", "jobs: [{name: a}]\n", "type is required"},
		{"bad id", "resources: [{id: 'a.b'}]\n", `id "a.b" must be`},
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

func TestLoadMissing(t *testing.T) {
	t.Parallel()
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
}
