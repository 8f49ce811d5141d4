package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/internal/cronexpr"
)

// validate checks a job definition at load time: a type, exactly one
// trigger, the cron expression, the policy names, the windows and the time
// zone. The scheduler checks the job again when it applies it.
func (j Job) validate(i int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("jobs[%d] (%s): %s", i, j.Name, fmt.Sprintf(format, args...))
	}
	if j.Type == "" {
		return bad("type is required")
	}
	triggers := 0
	for _, set := range []bool{j.Cron != "", j.Every != 0, j.At != ""} {
		if set {
			triggers++
		}
	}
	if triggers != 1 {
		return bad("set exactly one of cron, every and at")
	}
	if j.Cron != "" {
		if _, err := cronexpr.Parse(j.Cron); err != nil {
			return bad("cron %q: %v", j.Cron, err)
		}
	}
	if j.Every != 0 && (j.Every.Std() < time.Second || j.Every.Std()%time.Second != 0) {
		return bad("every %s must be a whole number of seconds, at least 1s", j.Every.Std())
	}
	if j.Timezone != "" {
		if _, err := time.LoadLocation(j.Timezone); err != nil {
			return bad("timezone %q is not a known IANA zone (e.g. Europe/Berlin)", j.Timezone)
		}
	}
	switch j.Misfire {
	case "", "skip", "once", "all":
	default:
		return bad("misfire %q: want skip, once or all", j.Misfire)
	}
	switch j.Overlap {
	case "", "allow", "forbid", "replace":
	default:
		return bad("overlap %q: want allow, forbid or replace", j.Overlap)
	}
	for _, w := range j.AllWindows() {
		from, to, ok := strings.Cut(w, "-")
		if !ok || !clockTime(from) || !clockTime(to) {
			return bad("window %q: want HH:MM-HH:MM", w)
		}
	}
	if j.Cooldown != 0 && j.Resource == "" {
		return bad("cooldown needs a resource")
	}
	if j.MaxPerHour < 0 || j.MaxAttempts < 0 || j.MisfireCap < 0 || j.Jitter < 0 || j.Cooldown < 0 || j.Timeout < 0 {
		return bad("max_per_hour, max_attempts, misfire_cap, jitter, cooldown and timeout must not be negative")
	}
	return nil
}

// AllWindows returns Window and Windows together.
func (j Job) AllWindows() []string {
	if j.Window == "" {
		return j.Windows
	}
	return append([]string{j.Window}, j.Windows...)
}

func clockTime(s string) bool {
	s = strings.TrimSpace(s)
	_, err := time.Parse("15:04", s)
	return err == nil || s == "24:00"
}
