package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/alertd"
	"github.com/gantry-dev/gantry/auditd"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/scheduler"
	"github.com/gantry-dev/gantry/workers"
)

func TestPrometheusExampleConfig(t *testing.T) {
	t.Parallel()
	tool := promtool(t)
	out, err := exec.Command(tool, "check", "config", "../../examples/prometheus.yml").CombinedOutput()
	if err != nil {
		t.Errorf("promtool check config examples/prometheus.yml: %v\n%s", err, out)
	}
}

// descPattern reads a metric's name and labels from its prometheus.Desc's
// String, the only place client_golang shows them.
var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)".*variableLabels: \{([^}]*)\}\}$`)

// registeredMetrics returns the label names of every metric the gantry
// processes register, by metric name: each component's metrics built on
// one registry as 'gantry run' builds them, with the system collector and
// the Go and process collectors. A vector without series is in it too,
// unlike in a scrape.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	env := brokertest.Start(t)
	reg := newRegistry()
	reg.MustRegister(newSystemCollector(nil))
	if _, err := workers.New(workers.Config{Metrics: reg, Logger: env.Log}, env.NC); err != nil {
		t.Fatal(err)
	}
	if _, err := scheduler.New(scheduler.Config{Metrics: reg, Logger: env.Log}, env.JS); err != nil {
		t.Fatal(err)
	}
	if _, err := auditd.New(auditd.Config{Dir: t.TempDir(), Metrics: reg, Logger: env.Log}, env.NC); err != nil {
		t.Fatal(err)
	}
	if _, err := alertd.New(alertd.Config{Metrics: reg, Logger: env.Log}, env.NC); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	out := map[string][]string{}
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("metric description %s: cannot read its name", d)
		}
		out[m[1]] = strings.FieldsFunc(m[2], func(r rune) bool { return r == ',' })
	}
	return out
}

// metricRef is a metric an expression names, with the labels it matches on
// (name{label="..."}).
var metricRef = regexp.MustCompile(`\b(gantry_[a-z0-9_]+)(\{[^}]*\})?`)

// matcherLabel is a label a matcher names.
var matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)

// TestGrafanaDashboardNamesRegisteredMetrics: every query of the example
// dashboard (each panel's expressions and the templating's) names metrics
// gantry registers, and matches only on labels they have; a renamed metric
// or label fails here rather than leaving a panel empty.
func TestGrafanaDashboardNamesRegisteredMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("examples/grafana-dashboard.json: %v", err)
	}
	// queries maps each query to where it is, panels in rows included.
	queries := map[string]string{}
	var walk func(raw []json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("panel %s: %v", r, err)
			}
			if len(p.Targets) == 0 && len(p.Panels) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries[tg.Expr] = "panel " + p.Title
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		queries[v.Definition] = "variable " + v.Name
	}
	if len(queries) < 10 {
		t.Fatalf("dashboard queries = %d, want the dashboard's (at least 10)", len(queries))
	}

	registered := registeredMetrics(t)
	for q, where := range queries {
		refs := metricRef.FindAllStringSubmatch(q, -1)
		if len(refs) == 0 {
			t.Errorf("%s: query %q names no gantry metric", where, q)
		}
		for _, ref := range refs {
			name := ref[1]
			labels, ok := registered[name]
			if !ok {
				// A histogram's series carry its name and a suffix.
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, cut := strings.CutSuffix(name, suffix); cut {
						labels, ok = registered[base]
						break
					}
				}
			}
			if !ok {
				t.Errorf("%s: query %q names %s, which gantry does not register", where, q, name)
				continue
			}
			for _, m := range matcherLabel.FindAllStringSubmatch(ref[2], -1) {
				if !slices.Contains(labels, m[1]) {
					t.Errorf("%s: query %q matches %s on label %s; its labels are %v", where, q, name, m[1], labels)
				}
			}
		}
	}
}
