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
	if got, want := f.Jobs[0].Every, "1m"; got != want {
		t.Errorf("Every = %q, want %q", got, want)
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
		{"bad duration", "jobs:\n  - {name: a, type: noop, every: soon}\n", `every "soon" must be a whole number of seconds`},
		{"dup resource", "resources: [{id: a}, {id: a}]\n", `duplicate id "a"`},
		{"unknown route", "resources: [{id: a, route: nowhere}]\n", `route "nowhere" is not among routes`},
		{"job without type", "jobs: [{name: a}]\n", "type is required"},
		{"bad id", "resources: [{id: 'a.b'}]\n", `id "a.b" must be`},
		{"unknown workers key", "workers: {retention: 7d}\n", `unknown key "retention"`},
		{"bad task retention", "workers: {task_retention: soon}\n", `"soon": want a Go duration (36h) or whole days (30d)`},
		{"negative task retention", "workers: {task_retention: -1h}\n", "want a duration of 0 or more"},
		{"sub-second task retention", "workers: {task_retention: 1500ms}\n", "workers.task_retention 1.5s: want whole seconds"},
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

func TestParseTaskRetention(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]*Retention{
		"jobs: []\n":                           nil,
		"workers: {task_retention: 30d}\n":     ptr(Retention(30 * 24 * time.Hour)),
		"workers: {task_retention: 36h}\n":     ptr(Retention(36 * time.Hour)),
		"workers: {task_retention: 0}\n":       ptr(Retention(0)),
		"workers:\n  task_retention: \"2s\"\n": ptr(Retention(2 * time.Second)),
	} {
		f, err := Parse([]byte(doc))
		if err != nil {
			t.Errorf("Parse(%q) = %v", doc, err)
			continue
		}
		if got := f.Workers.TaskRetention; (got == nil) != (want == nil) || got != nil && *got != *want {
			t.Errorf("Parse(%q) task_retention = %v, want %v", doc, got, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestLoadMissing(t *testing.T) {
	t.Parallel()
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
}
