// Package cronexpr parses gantry's cron expressions: robfig/cron's standard
// five fields, or six with seconds first, and descriptors (@daily,
// @every 5m), plus "L" in the day-of-month field for the last day of the
// month, which robfig/cron lacks ("0 18 L * *": 18:00 on the last day of
// every month).
package cronexpr

import (
	"errors"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse compiles expr into a schedule whose Next(t) is the first planned
// time strictly after t, in t's location, or the zero time if none follows.
func Parse(expr string) (cron.Schedule, error) {
	fields := strings.Fields(expr)
	dom := -1
	switch {
	case len(fields) == 5:
		dom = 2
	case len(fields) == 6:
		dom = 3
	}
	if dom < 0 || fields[dom] != "L" {
		return parser.Parse(expr)
	}
	if dow := fields[len(fields)-1]; dow != "*" && dow != "?" {
		return nil, errors.New(`"L" (last day of the month) needs "*" as the day of the week`)
	}
	fields[dom] = "28-31"
	inner, err := parser.Parse(strings.Join(fields, " "))
	if err != nil {
		return nil, err
	}
	return lastDay{inner}, nil
}

// lastDay keeps the times of inner that fall on the last day of a month.
type lastDay struct{ inner cron.Schedule }

// maxSkips bounds the search: the 28th to 31st of 4 years of months at any
// hour, far more than any expression that can fire needs.
const maxSkips = 4 * 12 * 4 * 24 * 60 * 60

func (l lastDay) Next(t time.Time) time.Time {
	for range maxSkips {
		t = l.inner.Next(t)
		if t.IsZero() || t.AddDate(0, 0, 1).Day() == 1 {
			return t
		}
	}
	return time.Time{}
}
