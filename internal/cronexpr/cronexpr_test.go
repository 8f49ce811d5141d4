package cronexpr

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLastDayOfMonth(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	s, err := Parse("0 18 L * *")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2027, 1, 15, 12, 0, 0, 0, berlin)
	var got []string
	for range 5 {
		at = s.Next(at)
		got = append(got, at.Format("2006-01-02 15:04 MST"))
	}
	want := []string{"2027-01-31 18:00 CET", "2027-02-28 18:00 CET", "2027-03-31 18:00 CEST", "2027-04-30 18:00 CEST", "2027-05-31 18:00 CEST"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("fire %d = %s, want %s", i, got[i], want[i])
		}
	}
	leap, err := Parse("30 0 0 L 2 *")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := leap.Next(time.Date(2027, 6, 1, 0, 0, 0, 0, time.UTC)), time.Date(2028, 2, 29, 0, 0, 30, 0, time.UTC); !got.Equal(want) {
		t.Errorf("seconds field, February = %v, want %v (leap year)", got, want)
	}
}

func TestPlainExpressions(t *testing.T) {
	t.Parallel()
	s, err := Parse("*/15 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2027, 1, 1, 10, 7, 0, 0, time.UTC)
	if got, want := s.Next(from), time.Date(2027, 1, 1, 10, 15, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("Next = %v, want %v", got, want)
	}
	for _, bad := range []string{"0 18 L * MON", "not cron", "0 18 L"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = nil error, want one", bad)
		}
	}
}
