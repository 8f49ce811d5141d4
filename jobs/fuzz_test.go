package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
)

// The fuzz targets of the scheduler's inputs (docs/RELIABILITY.md,
// "Fuzzing"): a job any client writes into gantry_jobs, the leader and
// term keys of gantry_scheduler, and the times a job names.

var fuzzStart = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// FuzzJobValue: a job value decodes and compiles, or is ErrInvalid; a
// compiled job's schedule answers without panicking.
func FuzzJobValue(f *testing.F) {
	for _, seed := range []string{
		`{"type":"noop","every":"1m"}`,
		`{"name":"fz","type":"noop","cron":"0 9 * * MON-FRI","timezone":"Europe/Paris","windows":["08:00-18:00"]}`,
		`{"type":"noop","at":"2026-12-24T18:00:00","timezone":"America/New_York"}`,
		`{"type":"noop","every":"-1s"}`,
		`{"type":"noop","cron":"TZ=UTC"}`,
		`{"name":"other","type":"noop","every":"1h"}`,
		`{"type":"noop","every":"1m","jitter":"9999999h","cooldown":"1ns"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := Decode("fz", data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode = %v, want ErrInvalid", err)
			}
			return
		}
		spec, err := Compile(j)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Compile = %v, want ErrInvalid", err)
			}
			return
		}
		next := spec.Next(fuzzStart)
		_ = spec.InWindow(next)
		_ = spec.Jitter(next)
		_ = spec.NextInWindow(fuzzStart)
		_ = spec.Fires(fuzzStart, 3)
	})
}

// FuzzParseAt: any time and zone parse or fail, without panicking.
func FuzzParseAt(f *testing.F) {
	f.Add("2026-12-24T18:00:00", "Europe/Paris")
	f.Add("2026-12-24T18:00:00Z", "")
	f.Add("2026-02-30 25:61", "Nowhere/City")
	f.Add("", "Local")
	f.Fuzz(func(t *testing.T, at, tz string) {
		_, _ = ParseAt(at, tz)
	})
}

// FuzzLeaderValue writes any bytes, with or without a TTL, into the
// scheduler's leader key and term key of a real broker: Leader answers a
// leader or ErrBadValue, and a campaign succeeds unless a well-formed
// leader with a TTL holds the key (no value stops scheduling for good).
func FuzzLeaderValue(f *testing.F) {
	f.Add([]byte(`{"id":"a","host":"h","term":3,"since":"2026-12-01T00:00:00Z"}`), []byte("3"), uint8(0))
	f.Add([]byte(`{"id":"a","term":3}`), []byte("4"), uint8(1))
	f.Add([]byte(`x`), []byte("not a number"), uint8(0))
	f.Add([]byte(`{"term":-1}`), []byte("18446744073709551615"), uint8(2))
	env := brokertest.Start(f)
	ctx := context.Background()
	s, err := NewSchedulerStore(ctx, env.JS)
	if err != nil {
		f.Fatal(err)
	}
	b := s.KeyValue()
	stream, err := env.JS.Stream(ctx, "KV_"+wire.BucketScheduler)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, leader, term []byte, ttl uint8) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Put(ctx, schedTermKey, term); err != nil {
			t.Fatal(err)
		}
		if ttl > 0 {
			_, err = b.Create(ctx, schedLeaderKey, leader, jetstream.KeyTTL(time.Duration(ttl)*time.Minute))
		} else {
			_, err = b.Put(ctx, schedLeaderKey, leader)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Leader(ctx); err != nil && !errors.Is(err, kv.ErrBadValue) && !errors.Is(err, ErrNoLeader) {
			t.Fatalf("Leader over %q = %v, want a leader or ErrBadValue", leader, err)
		}
		_, rev, err := s.Campaign(ctx, "fuzzer", "host", fuzzStart, time.Minute)
		switch {
		case err == nil:
			if err := s.Resign(ctx, rev); err != nil {
				t.Fatalf("Resign = %v", err)
			}
		case ttl > 0 && errors.Is(err, ErrLeaderHeld):
		default:
			t.Fatalf("Campaign over leader %q (ttl %dm), term %q = %v", leader, ttl, term, err)
		}
		if err := stream.Purge(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
