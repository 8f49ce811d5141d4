package jobs

import (
	"strings"
	"testing"
	"time"
)

func TestParseCronRefusesZonePrefix(t *testing.T) {
	t.Parallel()
	for _, expr := range []string{"TZ=UTC", "TZ=UTC 0 * * * *", "CRON_TZ=Europe/Berlin 0 3 * * *", " TZ="} {
		if _, err := parseCron(expr); err == nil || !strings.Contains(err.Error(), "timezone") {
			t.Errorf("parseCron(%q) = %v, want an error pointing to the timezone field", expr, err)
		}
	}
}

func TestParseCronRefusesBad(t *testing.T) {
	t.Parallel()
	for _, expr := range []string{"not cron", "0 18 L", "61 * * * *", "* * * * * * *", "@every", "0 0 32 * *", ""} {
		if _, err := parseCron(expr); err == nil {
			t.Errorf("parseCron(%q) = nil error, want one", expr)
		}
	}
}

// FuzzParseCron feeds any string to the parser and the schedule it
// compiles: neither may panic (robfig/cron, the parser gantry used before,
// panicked on "TZ=UTC", and a job any client writes into gantry_jobs then
// crash-looped every scheduler).
func FuzzParseCron(f *testing.F) {
	for _, seed := range []string{
		"* * * * *", "*/15 * * * *", "0 18 L * *", "0 0 L-3 * *", "*/20 * * * * *", "@daily", "@every 5m",
		"TZ=UTC", "CRON_TZ=", "0 9 * * MON-FRI", "60 * * * *", "* * 31 2 *", "0-59/0 * * * *", "@every -1s",
		"H * * * *", "? ? ? ? ?", "0 0 L * 1", "1-0 * * * *", "", " ", "\x00",
	} {
		f.Add(seed)
	}
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := parseCron(expr)
		if err != nil {
			return
		}
		_ = s.Next(start)
	})
}
