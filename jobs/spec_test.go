package jobs

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

func mustCompile(t *testing.T, j wire.Job) *Spec {
	t.Helper()
	if j.Name == "" {
		j.Name = "j"
	}
	if j.Type == "" {
		j.Type = "noop"
	}
	s, err := Compile(j)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return s
}

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestCronSchedule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, cron, tz, after string
		want                  []string
	}{
		{"five fields", "*/15 * * * *", "", "2026-11-30T10:07:00Z", []string{"2026-11-30T10:15:00Z", "2026-11-30T10:30:00Z"}},
		{"seconds", "*/20 * * * * *", "", "2026-11-30T10:00:05Z", []string{"2026-11-30T10:00:20Z", "2026-11-30T10:00:40Z", "2026-11-30T10:01:00Z"}},
		{"time zone", "0 3 * * *", "Europe/Berlin", "2026-11-30T00:00:00Z", []string{"2026-11-30T02:00:00Z", "2026-12-01T02:00:00Z"}},
		{"time zone summer", "0 3 * * *", "Europe/Berlin", "2026-07-01T00:00:00Z", []string{"2026-07-01T01:00:00Z"}},
		{"descriptor", "@hourly", "", "2026-11-30T10:07:00Z", []string{"2026-11-30T11:00:00Z"}},
		{"weekdays", "0 9 * * MON-FRI", "", "2026-12-04T10:00:00Z", []string{"2026-12-07T09:00:00Z"}},
		{"last day of february, seconds", "30 0 0 L 2 *", "", "2027-06-01T00:00:00Z", []string{"2028-02-29T00:00:30Z"}},
		{"third-last day", "0 0 L-2 * *", "", "2026-11-15T00:00:00Z", []string{"2026-11-28T00:00:00Z"}},
		{"last day of the month", "0 18 L * *", "Europe/Berlin", "2026-11-15T00:00:00Z", []string{"2026-11-30T17:00:00Z", "2026-12-31T17:00:00Z", "2027-01-31T17:00:00Z", "2027-02-28T17:00:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := mustCompile(t, wire.Job{Cron: tc.cron, Timezone: tc.tz})
			at := ts(tc.after)
			for i, w := range tc.want {
				at = s.Next(at)
				if !at.Equal(ts(w)) {
					t.Fatalf("fire %d = %s, want %s", i, at.UTC().Format(time.RFC3339), w)
				}
			}
		})
	}
}

func TestEverySchedule(t *testing.T) {
	t.Parallel()
	s := mustCompile(t, wire.Job{Every: "1m"})
	got := s.Next(ts("2026-11-30T10:00:30Z"))
	if want := ts("2026-11-30T10:01:00Z"); !got.Equal(want) {
		t.Errorf("Next(10:00:30) = %s, want %s", got, want)
	}
	if got, want := s.Next(got), ts("2026-11-30T10:02:00Z"); !got.Equal(want) {
		t.Errorf("Next(10:01:00) = %s, want %s", got, want)
	}
	s = mustCompile(t, wire.Job{Every: "7s"})
	a := s.Next(ts("2026-11-30T10:00:00Z"))
	if b := s.Next(a); b.Sub(a) != 7*time.Second || a.Unix()%7 != 0 {
		t.Errorf("every 7s: %s then %s, want multiples of 7 s since the epoch", a, b)
	}
}

func TestAtSchedule(t *testing.T) {
	t.Parallel()
	at := ts("2026-12-01T03:00:00Z").Add(300 * time.Millisecond)
	j, err := Normalize(wire.Job{Name: "once", Type: "noop", At: &at})
	if err != nil {
		t.Fatal(err)
	}
	s := mustCompile(t, j)
	if got, want := s.Next(ts("2026-11-30T00:00:00Z")), ts("2026-12-01T03:00:00Z"); !got.Equal(want) {
		t.Errorf("Next before at = %s, want %s (truncated to the second)", got, want)
	}
	if got := s.Next(ts("2026-12-01T03:00:00Z")); !got.IsZero() {
		t.Errorf("Next at or after at = %s, want none", got)
	}
}

func TestWindows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		windows []string
		tz      string
		at      string
		want    bool
	}{
		{"none is always", nil, "", "2026-11-30T03:00:00Z", true},
		{"inside", []string{"08:00-17:00"}, "", "2026-11-30T08:00:00Z", true},
		{"end is exclusive", []string{"08:00-17:00"}, "", "2026-11-30T17:00:00Z", false},
		{"wraps midnight late", []string{"22:00-02:00"}, "", "2026-11-30T23:30:00Z", true},
		{"wraps midnight early", []string{"22:00-02:00"}, "", "2026-11-30T01:59:00Z", true},
		{"wraps midnight outside", []string{"22:00-02:00"}, "", "2026-11-30T12:00:00Z", false},
		{"time zone", []string{"08:00-09:00"}, "America/New_York", "2026-11-30T13:30:00Z", true},
		{"time zone outside", []string{"08:00-09:00"}, "America/New_York", "2026-11-30T08:30:00Z", false},
		{"second window", []string{"01:00-02:00", "12:00-24:00"}, "", "2026-11-30T23:59:00Z", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := mustCompile(t, wire.Job{Every: "1m", Windows: tc.windows, Timezone: tc.tz})
			if got := s.InWindow(ts(tc.at)); got != tc.want {
				t.Errorf("InWindow(%s) = %v, want %v", tc.at, got, tc.want)
			}
		})
	}
}

func TestJitterBounds(t *testing.T) {
	t.Parallel()
	const jitter = 10 * time.Second
	s := mustCompile(t, wire.Job{Every: "1m", Jitter: jitter.String()})
	other := mustCompile(t, wire.Job{Name: "other", Every: "1m", Jitter: jitter.String()})
	seen := map[time.Duration]bool{}
	differ := 0
	p := ts("2026-11-30T00:00:00Z")
	for range 1000 {
		p = s.Next(p)
		d := s.Jitter(p)
		if d < 0 || d >= jitter {
			t.Fatalf("Jitter(%s) = %s, want within [0, %s)", p, d, jitter)
		}
		if again := s.Jitter(p); again != d {
			t.Fatalf("Jitter(%s) = %s then %s, want the same (deterministic)", p, d, again)
		}
		if other.Jitter(p) != d {
			differ++
		}
		seen[d.Truncate(time.Second)] = true
	}
	if len(seen) != 10 {
		t.Errorf("jitter spread over %d of 10 seconds, want all", len(seen))
	}
	if differ < 900 {
		t.Errorf("two jobs share jitter for %d of 1000 fires, want them spread apart", 1000-differ)
	}
	if d := mustCompile(t, wire.Job{Every: "1m"}).Jitter(p); d != 0 {
		t.Errorf("Jitter without jitter = %s, want 0", d)
	}
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	j, err := Normalize(wire.Job{Name: "a", Type: "noop", Every: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	if j.Queue != wire.DefaultQueue || j.Misfire != DefaultMisfire || j.Overlap != DefaultOverlap || j.MisfireCap != DefaultMisfireCap {
		t.Errorf("defaults = queue %q misfire %q overlap %q cap %d, want %q %q %q %d", j.Queue, j.Misfire, j.Overlap, j.MisfireCap,
			wire.DefaultQueue, DefaultMisfire, DefaultOverlap, DefaultMisfireCap)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := wire.Job{Name: "a", Type: "noop", Every: "1m"}
	for _, tc := range []struct {
		name string
		edit func(*wire.Job)
		want string
	}{
		{"bad name", func(j *wire.Job) { j.Name = "a.b" }, "name"},
		{"no type", func(j *wire.Job) { j.Type = "" }, "type"},
		{"no trigger", func(j *wire.Job) { j.Every = "" }, "exactly one"},
		{"two triggers", func(j *wire.Job) { j.Cron = "* * * * *" }, "exactly one"},
		{"bad cron", func(j *wire.Job) { j.Every, j.Cron = "", "61 * * * *" }, "cron"},
		{"sub-second every", func(j *wire.Job) { j.Every = "500ms" }, "every"},
		{"bad zone", func(j *wire.Job) { j.Timezone = "Mars/Base" }, "timezone"},
		{"bad window", func(j *wire.Job) { j.Windows = []string{"8-17"} }, "window"},
		{"bad jitter", func(j *wire.Job) { j.Jitter = "-1s" }, "jitter"},
		{"cooldown without resource", func(j *wire.Job) { j.Cooldown = "1m" }, "cooldown"},
		{"bad misfire", func(j *wire.Job) { j.Misfire = "never" }, "misfire"},
		{"bad overlap", func(j *wire.Job) { j.Overlap = "queue" }, "overlap"},
		{"bad payload", func(j *wire.Job) { j.Payload = json.RawMessage(`{`) }, "payload"},
		{"bad timeout", func(j *wire.Job) { j.Timeout = "soon" }, "timeout"},
		{"negative budget", func(j *wire.Job) { j.MaxPerHour = -1 }, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := ok
			tc.edit(&j)
			err := Validate(j)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
	if err := Validate(ok); err != nil {
		t.Errorf("Validate(valid) = %v, want nil", err)
	}
}

func TestParseAt(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"2026-12-01T03:00:00Z":      "2026-12-01T03:00:00Z",
		"2026-12-01T04:00:00+01:00": "2026-12-01T03:00:00Z",
		"2026-12-01 04:00":          "2026-12-01T03:00:00Z",
		"2026-12-01T04:00:30":       "2026-12-01T03:00:30Z",
	} {
		got, err := ParseAt(in, "Europe/Berlin")
		if err != nil || !got.Equal(ts(want)) {
			t.Errorf("ParseAt(%q) = %s, %v, want %s", in, got, err, want)
		}
	}
	if _, err := ParseAt("tomorrow", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseAt(tomorrow) = %v, want ErrInvalid", err)
	}
}

// TestNextInWindow: the next fire of a job with a window, jitter and a
// time zone is inside the window, in its zone, jitter included; the planned
// times outside are counted.
func TestNextInWindow(t *testing.T) {
	t.Parallel()
	s, err := Compile(wire.Job{Name: "cam", Type: "noop", Every: "10s", Windows: []string{"06:00-22:00"},
		Timezone: "Europe/Berlin", Jitter: "5s"})
	if err != nil {
		t.Fatal(err)
	}
	// 22:30 Berlin (21:30 UTC): the next fire is at 06:00 Berlin.
	f := s.NextInWindow(ts("2026-12-01T21:30:00Z"))
	if want := ts("2026-12-02T05:00:00Z"); !f.Planned.Equal(want) || f.At.Before(want) || f.At.Sub(want) >= 5*time.Second {
		t.Errorf("NextInWindow(22:30 Berlin) = planned %s at %s, want planned %s within 5s jitter", f.Planned, f.At, want)
	}
	if f.Skipped != 2699 {
		t.Errorf("skipped = %d, want %d planned times outside the window", f.Skipped, 2699)
	}
	fires := s.Fires(ts("2026-12-01T21:30:00Z"), 3)
	if len(fires) != 3 || !fires[2].Planned.Equal(ts("2026-12-02T05:00:20Z")) || fires[1].Skipped != 0 {
		t.Errorf("Fires(3) = %+v, want 06:00:00, 06:00:10, 06:00:20 Berlin", fires)
	}
}
