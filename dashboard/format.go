package dashboard

import (
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/client"
)

// pageNames are the page templates, each parsed with the layout and the
// shared parts.
var pageNames = []string{"overview", "tasks", "task", "resources", "resource", "routes", "jobs", "job", "audit", "login", "confirm", "error"}

// navItem is one entry of the navigation bar.
type navItem struct{ Key, URL, Label string }

var navItems = []navItem{
	{"overview", "/", "Overview"}, {"tasks", "/tasks", "Tasks"}, {"resources", "/resources", "Resources"},
	{"routes", "/routes", "Routes"}, {"jobs", "/jobs", "Jobs"}, {"audit", "/audit", "Audit"},
}

// navKey is the navigation entry a page belongs to.
func navKey(page string) string {
	switch page {
	case "task":
		return "tasks"
	case "resource":
		return "resources"
	case "job":
		return "jobs"
	}
	return page
}

var funcs = template.FuncMap{
	"nav":    func() []navItem { return navItems },
	"navKey": navKey,
	"lower":  func(v any) string { return strings.ToLower(fmt.Sprint(v)) },
	"dict":   dict,
	"add":    func(a, b int) int { return a + b },
	"ago":    ago,
	"clock":  clock,
	"stamp":  stamp,
	"when":   when,
	"dur":    dur,
	"trunc":  trunc,
	"pct":    pct,
	"compact": func(raw json.RawMessage) string {
		if len(raw) == 0 {
			return ""
		}
		return string(raw)
	},
	"bars":     bars,
	"schedule": schedule,
	"seconds":  func(f *float64) string { return seconds(f) },
	"score":    func(f float64) int { return int(math.Round(min(max(f, 0), 100))) },
}

// dict builds the map a shared template takes from its pairs of name and
// value.
func dict(kv ...any) (map[string]any, error) {
	if len(kv)%2 != 0 {
		return nil, fmt.Errorf("dict: want pairs, got %d values", len(kv))
	}
	m := make(map[string]any, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		k, ok := kv[i].(string)
		if !ok {
			return nil, fmt.Errorf("dict: key %v is not a string", kv[i])
		}
		m[k] = kv[i+1]
	}
	return m, nil
}

func parsePages() (map[string]*template.Template, error) {
	out := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(webFS, "web/templates/layout.html", "web/templates/parts.html", "web/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// timeOf reads a time.Time or a *time.Time; false for nil or zero.
func timeOf(v any) (time.Time, bool) {
	switch t := v.(type) {
	case time.Time:
		return t, !t.IsZero()
	case *time.Time:
		if t != nil && !t.IsZero() {
			return *t, true
		}
	}
	return time.Time{}, false
}

// ago says how long ago (or in how long) v is.
func ago(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return ""
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + short(-d)
	}
	return short(d) + " ago"
}

// short writes a duration as people read it: 42s, 3m 5s, 2h 10m, 4d 3h.
func short(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm %ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh %dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd %dh", s/86400, s%86400/3600)
}

// clock is v's local time of day, with the date when it is not today.
func clock(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return ""
	}
	t = t.Local()
	if y, m, d := t.Date(); y == time.Now().Year() && m == time.Now().Month() && d == time.Now().Day() {
		return t.Format("15:04:05")
	}
	return t.Format("2006-01-02 15:04:05")
}

// when is v's local date and time to the millisecond.
func when(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return ""
	}
	return t.Local().Format("2006-01-02 15:04:05.000")
}

// stamp is v in RFC 3339, for a time element's datetime.
func stamp(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// dur writes a duration rounded for display.
func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + dur(-d)
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

func trunc(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func pct(f *float64) string {
	if f == nil {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", *f*100)
}

func seconds(f *float64) string {
	if f == nil {
		return "–"
	}
	return dur(time.Duration(*f * float64(time.Second)))
}

// bar is one minute of the sparkline: its stack of succeeded (OK) and
// other (Bad) tasks, in the SVG's units.
type bar struct {
	X, W            float64
	OKY, OKH        float64
	BadY, BadH      float64
	Minute, Caption string
}

// The sparkline's size, in SVG units.
const (
	sparkW = 600.0
	sparkH = 64.0
)

func bars(s spark) []bar {
	out := make([]bar, 0, len(s.OK))
	top := max(float64(s.Max), 1)
	w := sparkW / float64(len(s.OK))
	now := time.Now()
	for i := range s.OK {
		okH := float64(s.OK[i]) / top * (sparkH - 2)
		badH := float64(s.Bad[i]) / top * (sparkH - 2)
		b := bar{X: float64(i) * w, W: w - 1, OKY: sparkH - okH, OKH: okH, BadY: sparkH - okH - badH, BadH: badH}
		minute := now.Add(-time.Duration(len(s.OK)-1-i) * time.Minute).Local().Format("15:04")
		b.Caption = fmt.Sprintf("%s: %d succeeded, %d other", minute, s.OK[i], s.Bad[i])
		out = append(out, b)
	}
	return out
}

// schedule says when a job fires.
func schedule(j client.JobInfo) string {
	var s string
	switch {
	case j.Cron != "":
		s = "cron " + j.Cron
	case j.Every != "":
		s = "every " + j.Every
	case j.At != nil:
		s = "at " + j.At.Local().Format("2006-01-02 15:04")
	}
	if len(j.Windows) > 0 {
		s += " in " + strings.Join(j.Windows, ", ")
	}
	return s
}
