package config

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParse feeds any document to the config parser: it parses, or fails
// with an error matching ErrInvalid, without panicking
// (docs/RELIABILITY.md, "Fuzzing").
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"queues:\n  default: {concurrency: 2}\n",
		"resources:\n  - id: cam1\n    reclaim: fault\n",
		"jobs:\n  - name: tick\n    type: noop\n    every: 1m\n",
		"routes:\n  - id: r1\n    proxy: socks5://127.0.0.1:1080\n",
		"audit:\n  retention: 30d\n",
		"jobs: [{name: x, type: noop, cron: 'TZ=UTC'}]\n",
		"{", "- a\n- b\n", "\t", "resources: &a [*a]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := Parse(data); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("Parse = %v, want ErrInvalid", err)
		}
	})
}

// FuzzParseRetention: a retention parses to what it says, 0 or more, or
// fails; whole days never overflow into another duration.
func FuzzParseRetention(f *testing.F) {
	for _, seed := range []string{"30d", "36h", "0", "-1s", "106751d", "106752d", "4294967295d", "d", "1.5d", "9223372036854775807ns"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseRetention(s)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseRetention(%q) = %v, want 0 or more", s, d)
		}
		if days, ok := strings.CutSuffix(s, "d"); ok {
			n, err := strconv.ParseUint(days, 10, 64)
			if err != nil || d%(24*time.Hour) != 0 || uint64(d/(24*time.Hour)) != n {
				t.Fatalf("ParseRetention(%q) = %v, want %s whole days", s, d, days)
			}
		}
	})
}
