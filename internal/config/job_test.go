package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/gantry-dev/gantry/kv"
)

func TestJobValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, job, want string
	}{
		{"ok", `{name: a, type: noop, every: 1m, windows: ["08:00-17:00"], window: "20:00-22:00", misfire: all, misfire_cap: 3, overlap: forbid, cooldown: 1m, resource: cam1}`, ""},
		{"cron ok", `{name: a, type: noop, cron: "0 3 * * *", timezone: Europe/Berlin}`, ""},
		{"no type", `{name: a, every: 1m}`, "type is required"},
		{"no trigger", `{name: a, type: noop}`, "exactly one of cron, every and at"},
		{"two triggers", `{name: a, type: noop, every: 1m, cron: "* * * * *"}`, "exactly one"},
		{"bad cron", `{name: a, type: noop, cron: "61 * * * *"}`, "cron"},
		{"sub-second", `{name: a, type: noop, every: 500ms}`, "whole number of seconds"},
		{"zone", `{name: a, type: noop, every: 1m, timezone: Mars/Base}`, "timezone"},
		{"misfire", `{name: a, type: noop, every: 1m, misfire: later}`, "misfire"},
		{"overlap", `{name: a, type: noop, every: 1m, overlap: queue}`, "overlap"},
		{"window", `{name: a, type: noop, every: 1m, window: "8-17"}`, "window"},
		{"cooldown", `{name: a, type: noop, every: 1m, cooldown: 1m}`, "cooldown needs a resource"},
		{"unknown key", `{name: a, type: noop, every: 1m, colour: red}`, `unknown key "colour"`},
		{"empty window", `{name: a, type: noop, every: 1m, window: "08:00-08:00"}`, "window"},
		{"bad at", `{name: a, type: noop, at: tomorrow}`, "at"},
		{"at in zone", `{name: a, type: noop, at: "2027-01-01 08:00", timezone: Europe/Berlin}`, ""},
		{"cron zone prefix", `{name: a, type: noop, cron: "TZ=UTC"}`, "timezone"},
		{"bad name", `{name: "a b", type: noop, every: 1m}`, "name"},
		{"bad timeout", `{name: a, type: noop, every: 1m, timeout: soon}`, "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte("jobs:\n  - " + tc.job + "\n"))
			if tc.want == "" {
				if err != nil {
					t.Errorf("Parse = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, kv.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}
