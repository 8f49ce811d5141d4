package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/workers"
)

// durationRange is the range of values a duration flag accepts.
type durationRange struct{ min, max time.Duration }

// Bounds shared by the duration flags.
const (
	// year bounds the settings that pace work: a longer one is a typo, and
	// doubling it (backoff, consumer BackOff) must not overflow.
	year = 366 * 24 * time.Hour
	// century bounds the retentions, which may reasonably be years.
	century = 100 * 365 * 24 * time.Hour
)

// anyDuration is the range of a duration flag not listed in
// durationRanges: no negative value, nothing that could overflow.
var anyDuration = durationRange{0, century}

// durationRanges bounds the duration flags that need more than
// anyDuration, by flag name (the same range wherever the name is used).
var durationRanges = map[string]durationRange{
	"sync-interval":            {broker.MinSyncInterval, broker.MaxSyncInterval},
	"ack-wait":                 {workers.MinAckWait, workers.MaxAckWait},
	"backoff-base":             {time.Millisecond, year},
	"backoff-max":              {time.Millisecond, year},
	"delay":                    {time.Millisecond, year},
	"no-handler-delay":         {time.Millisecond, year},
	"handler-heartbeat-window": {time.Millisecond, year},
	"task-timeout":             {time.Millisecond, year},
	"kill-grace":               {0, time.Hour},
	"leader-ttl":               {time.Second, time.Hour},
	"misfire-threshold":        {0, year},
	"run-history":              {time.Second, year},
	"ttl":                      {0, lease.MaxTTL},
	"timeout":                  {0, year},
	"wait":                     {0, year},
	"wait-timeout":             {0, year},
}

// checkDurations refuses, as bad usage, a duration flag of cmd outside its
// range (durationRanges, else anyDuration): the one check of every
// duration flag, run before any command. A value the libraries would take
// as it is may still panic or overflow deep inside them (a 1ns sync
// interval inside nats-server, a 1000000h ack wait doubled into the
// consumer's BackOff).
func checkDurations(cmd *cobra.Command, _ []string) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Value.Type() != "duration" {
			return
		}
		d, ok := durationOf(f.Value)
		if !ok {
			return
		}
		r, listed := durationRanges[f.Name]
		if !listed {
			r = anyDuration
		}
		if d < r.min || d > r.max {
			err = usageError("--%s %s: want %s", f.Name, f.Value, r)
		}
	})
	return err
}

// durationOf reads a duration flag's value.
func durationOf(v pflag.Value) (time.Duration, bool) {
	if r, ok := v.(*retentionValue); ok {
		return time.Duration(*r), true
	}
	d, err := time.ParseDuration(v.String())
	return d, err == nil
}

// String says the range as a flag's error does.
func (r durationRange) String() string {
	if r.min == 0 {
		return fmt.Sprintf("0 or more, at most %v", r.max)
	}
	return fmt.Sprintf("%v to %v", r.min, r.max)
}
