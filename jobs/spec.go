package jobs

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// ErrInvalid marks every error about a job definition. It matches
// kv.ErrInvalid.
var ErrInvalid = kv.Sentinel("invalid job", kv.ErrInvalid)

// Default policies of a job that names none.
const (
	// DefaultMisfire fires the latest missed time once after downtime.
	DefaultMisfire = wire.MisfireOnce
	// DefaultOverlap fires whether or not the previous run has finished.
	DefaultOverlap = wire.OverlapAllow
	// DefaultMisfireCap bounds the fires of MisfireAll after downtime.
	DefaultMisfireCap = 100
)

// schedule yields the planned times of a job.
type schedule interface {
	// Next returns the first planned time strictly after t, or the zero
	// time when there is none.
	Next(t time.Time) time.Time
}

// Spec is a job definition checked and compiled: what a scheduler plans
// with and what 'gantry job' previews. Compile makes one.
type Spec struct {
	// Job is the definition as compiled (normalize it first to get the
	// defaults filled).
	Job      wire.Job
	sched    schedule
	loc      *time.Location
	windows  []window
	jitter   time.Duration
	cooldown time.Duration
}

// Next returns the first planned time of the job strictly after t, before
// jitter and windows, or the zero time when there is none (a one-shot job
// that has passed).
func (s *Spec) Next(t time.Time) time.Time { return s.sched.Next(t) }

// Location is the time zone the job's cron, at and windows are read in.
func (s *Spec) Location() *time.Location { return s.loc }

// Cooldown is how long jobs on the job's resource wait after a run on it
// ended; 0 for none.
func (s *Spec) Cooldown() time.Duration { return s.cooldown }

// Normalize fills a job's defaults (queue, misfire and overlap policies,
// misfire cap) and validates it; it returns the job as it should be stored.
func Normalize(j wire.Job) (wire.Job, error) {
	if j.Queue == "" {
		j.Queue = wire.DefaultQueue
	}
	if j.Misfire == "" {
		j.Misfire = DefaultMisfire
	}
	if j.Overlap == "" {
		j.Overlap = DefaultOverlap
	}
	if j.MisfireCap == 0 {
		j.MisfireCap = DefaultMisfireCap
	}
	if j.At != nil {
		at := j.At.Truncate(time.Second)
		j.At = &at
	}
	if _, err := Compile(j); err != nil {
		return wire.Job{}, err
	}
	return j, nil
}

// Validate reports what is wrong with a job definition, if anything. It is
// the one validator of jobs: the config file, 'gantry job add' and the
// scheduler (for a job any client wrote into gantry_jobs) all use it.
func Validate(j wire.Job) error {
	_, err := Compile(j)
	return err
}

// Compile checks j and compiles its trigger, windows and policies. Every
// error matches ErrInvalid and names the job.
func Compile(j wire.Job) (*Spec, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalid, j.Name, fmt.Sprintf(format, args...))
	}
	if !wire.ValidJobName(j.Name) {
		return nil, fmt.Errorf("%w: name %q must be 1 to %d letters, digits, '-' or '_'", ErrInvalid, j.Name, wire.MaxJobNameLen)
	}
	if j.Type == "" {
		return nil, bad("type is required")
	}
	if !wire.ValidToken(j.Type) {
		return nil, bad("type %q must be set, without spaces, '.', '*' or '>'", j.Type)
	}
	if j.Queue != "" && !wire.ValidToken(j.Queue) {
		return nil, bad("queue %q must be without spaces, '.', '*' or '>'", j.Queue)
	}
	if len(j.Payload) > 0 && !json.Valid(j.Payload) {
		return nil, bad("payload is not valid JSON")
	}
	if j.Timeout != "" {
		if d, err := time.ParseDuration(j.Timeout); err != nil || d <= 0 {
			return nil, bad("timeout %q is not a positive duration such as 30s", j.Timeout)
		}
	}
	if j.MaxAttempts < 0 || j.MaxPerHour < 0 || j.MisfireCap < 0 {
		return nil, bad("max_attempts, max_per_hour and misfire_cap must not be negative")
	}
	s := &Spec{Job: j, loc: time.UTC}
	if j.Timezone != "" {
		loc, err := time.LoadLocation(j.Timezone)
		if err != nil {
			return nil, bad("timezone %q is not a known IANA zone (e.g. Europe/Berlin)", j.Timezone)
		}
		s.loc = loc
	}
	triggers := 0
	for _, set := range []bool{j.Cron != "", j.Every != "", j.At != nil} {
		if set {
			triggers++
		}
	}
	if triggers != 1 {
		return nil, bad("set exactly one of cron, every and at")
	}
	switch {
	case j.Cron != "":
		cs, err := parseCron(j.Cron)
		if err != nil {
			return nil, bad("cron %q: %v", j.Cron, err)
		}
		s.sched = cronSchedule{cs: cs, loc: s.loc}
	case j.Every != "":
		d, err := time.ParseDuration(j.Every)
		if err != nil || d < time.Second || d%time.Second != 0 {
			return nil, bad("every %q must be a whole number of seconds, at least 1s (e.g. 30s, 5m)", j.Every)
		}
		s.sched = everySchedule(d)
	default:
		s.sched = atSchedule(j.At.Truncate(time.Second))
	}
	for _, w := range j.Windows {
		win, err := parseWindow(w)
		if err != nil {
			return nil, bad("%v", err)
		}
		s.windows = append(s.windows, win)
	}
	var err error
	if s.jitter, err = nonNegative("jitter", j.Jitter); err != nil {
		return nil, bad("%v", err)
	}
	if s.cooldown, err = nonNegative("cooldown", j.Cooldown); err != nil {
		return nil, bad("%v", err)
	}
	if s.cooldown > 0 && j.Resource == "" {
		return nil, bad("cooldown needs a resource")
	}
	switch j.Misfire {
	case "", wire.MisfireSkip, wire.MisfireOnce, wire.MisfireAll:
	default:
		return nil, bad("misfire %q: want skip, once or all", j.Misfire)
	}
	switch j.Overlap {
	case "", wire.OverlapAllow, wire.OverlapForbid, wire.OverlapReplace:
	default:
		return nil, bad("overlap %q: want allow, forbid or replace", j.Overlap)
	}
	return s, nil
}

func nonNegative(name, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s %q is not a duration such as 30s", name, v)
	}
	return d, nil
}

// cronSchedule reads a cron expression in a time zone.
type cronSchedule struct {
	cs  schedule
	loc *time.Location
}

func (c cronSchedule) Next(t time.Time) time.Time { return c.cs.Next(t.In(c.loc)) }

// everySchedule fires at every multiple of d since the Unix epoch, so that
// every scheduler, before and after a restart, plans the same times.
type everySchedule time.Duration

func (e everySchedule) Next(t time.Time) time.Time {
	d := int64(e)
	return time.Unix(0, (t.UnixNano()/d+1)*d).UTC()
}

// atSchedule fires once.
type atSchedule time.Time

func (a atSchedule) Next(t time.Time) time.Time {
	if at := time.Time(a); at.After(t) {
		return at
	}
	return time.Time{}
}

// window is an allowed time of day, [from, to) in minutes since midnight;
// from > to wraps midnight.
type window struct{ from, to int }

func parseWindow(s string) (window, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return window{}, fmt.Errorf("window %q: want HH:MM-HH:MM", s)
	}
	from, err1 := parseClock(a)
	to, err2 := parseClock(b)
	if err1 != nil || err2 != nil || from == to {
		return window{}, fmt.Errorf("window %q: want HH:MM-HH:MM with two different times (00:00 to 24:00)", s)
	}
	return window{from: from, to: to}, nil
}

func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		if strings.TrimSpace(s) == "24:00" {
			return 24 * 60, nil
		}
		return 0, err
	}
	return t.Hour()*60 + t.Minute(), nil
}

func (w window) contains(minute int) bool {
	if w.from < w.to {
		return minute >= w.from && minute < w.to
	}
	return minute >= w.from || minute < w.to
}

// InWindow reports whether t, read in the job's zone, is inside one of its
// windows (always, when it has none).
func (s *Spec) InWindow(t time.Time) bool {
	if len(s.windows) == 0 {
		return true
	}
	lt := t.In(s.loc)
	m := lt.Hour()*60 + lt.Minute()
	for _, w := range s.windows {
		if w.contains(m) {
			return true
		}
	}
	return false
}

// Jitter returns the delay of the fire planned at planned: a hash of the
// job and the planned time in [0, jitter), the same on every scheduler, so a
// failover does not move a fire.
func (s *Spec) Jitter(planned time.Time) time.Duration {
	if s.jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.Job.Name))
	var b [8]byte
	n := uint64(planned.UnixNano())
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	_, _ = h.Write(b[:])
	return time.Duration(h.Sum64() % uint64(s.jitter))
}

// atLayouts are the forms ParseAt accepts besides RFC 3339.
var atLayouts = []string{"2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02T15:04", "2006-01-02 15:04"}

// ParseAt reads a one-shot time: RFC 3339, or a local date and time
// ("2006-01-02 15:04[:05]") in the IANA zone tz (UTC when empty).
func ParseAt(s, tz string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: timezone %q is not a known IANA zone", ErrInvalid, tz)
		}
		loc = l
	}
	for _, layout := range atLayouts {
		if t, err := time.ParseInLocation(layout, s, loc); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: at %q: want RFC 3339 or 2006-01-02 15:04[:05]", ErrInvalid, s)
}

// maxWindowScan bounds the planned times NextInWindow passes over: a
// year of a job every 5 minutes outside a one-hour window.
const maxWindowScan = 100_000

// Fire is one fire of a job: its planned time, the moment it fires
// (planned plus jitter) and how many planned times before it were passed
// over as outside the windows.
type Fire struct {
	Planned time.Time `json:"planned"`
	At      time.Time `json:"at"`
	Skipped int       `json:"skipped_before,omitempty"`
}

// NextInWindow returns the first fire planned strictly after t whose
// moment (planned plus jitter) is inside the job's windows, counting the
// planned times it passes over. The zero Fire means none: a one-shot job
// that has passed, or none in the next maxWindowScan planned times
// (Skipped then says how many were looked at).
func (s *Spec) NextInWindow(t time.Time) Fire {
	skipped := 0
	for p := s.sched.Next(t); !p.IsZero(); p = s.sched.Next(p) {
		at := p.Add(s.Jitter(p))
		if s.InWindow(at) {
			return Fire{Planned: p, At: at, Skipped: skipped}
		}
		if skipped++; skipped >= maxWindowScan {
			return Fire{Skipped: skipped}
		}
	}
	return Fire{}
}

// Fires returns the next n fires after t, as NextInWindow finds them.
func (s *Spec) Fires(t time.Time, n int) []Fire {
	var out []Fire
	for len(out) < n {
		f := s.NextInWindow(t)
		if f.Planned.IsZero() {
			break
		}
		out = append(out, f)
		t = f.Planned
	}
	return out
}
