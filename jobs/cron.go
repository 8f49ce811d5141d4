package jobs

import (
	"errors"
	"strings"

	cron "github.com/netresearch/go-cron"
)

// cronParser reads gantry's cron expressions: five fields, or six with
// seconds first, descriptors (@daily, @every 5m), and "L" in the
// day-of-month field for the last day of the month ("0 18 L * *").
// github.com/netresearch/go-cron is the maintained fork of robfig/cron,
// which panics on some input.
var cronParser = cron.MustNewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor | cron.DomL)

// errCronZone refuses a time zone inside the expression: a job's zone is
// its timezone field, which also applies to at and the windows.
var errCronZone = errors.New(`a time zone prefix (TZ=, CRON_TZ=) is not allowed: set the job's timezone instead`)

// parseCron compiles expr. Whatever the input, it returns an error rather
// than panicking (FuzzParseCron checks).
func parseCron(expr string) (schedule, error) {
	if s := strings.TrimSpace(expr); strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
		return nil, errCronZone
	}
	return cronParser.Parse(expr)
}
