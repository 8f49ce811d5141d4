package main

import (
	"slices"
	"testing"

	"github.com/spf13/cobra"
)

// FuzzDurationFlag sets any text as the value of each duration flag, and
// of the audit retention (which also takes days): a value is refused by
// its parser or by checkDurations, or it lies in the flag's range
// (docs/RELIABILITY.md, "Fuzzing").
func FuzzDurationFlag(f *testing.F) {
	for _, s := range []string{"1s", "1ns", "-1s", "1000000h", "30d", "0", "9223372036854775807ns", "106752d", "4294967295d", "1.5h", ""} {
		f.Add(s)
	}
	names := []string{"audit-retention"}
	for name := range durationRanges {
		names = append(names, name)
	}
	slices.Sort(names)
	f.Fuzz(func(t *testing.T, value string) {
		for _, name := range names {
			cmd := &cobra.Command{Use: "fuzz"}
			var retention retentionValue
			if name == "audit-retention" {
				cmd.Flags().Var(&retention, name, "")
			} else {
				cmd.Flags().Duration(name, 0, "")
			}
			if err := cmd.Flags().Set(name, value); err != nil {
				continue
			}
			if err := checkDurations(cmd, nil); err != nil {
				continue
			}
			d, ok := durationOf(cmd.Flags().Lookup(name).Value)
			if !ok {
				t.Fatalf("--%s %q: accepted, but its value %q does not read back", name, value, cmd.Flags().Lookup(name).Value)
			}
			r, listed := durationRanges[name]
			if !listed {
				r = anyDuration
			}
			if d < r.min || d > r.max {
				t.Fatalf("--%s %q = %v, accepted outside %s", name, value, d, r)
			}
		}
	})
}
