package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBadDurationFlags: every duration flag out of its range is bad usage,
// exit 2 naming the flag, refused before anything starts or connects.
func TestBadDurationFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"ack wait overflows the backoff", []string{"worker", "--ack-wait", "1000000h"}, "--ack-wait"},
		{"negative delay", []string{"worker", "--delay", "-1s"}, "--delay"},
		{"negative kill grace", []string{"worker", "--kill-grace", "-1s"}, "--kill-grace"},
		{"huge task timeout", []string{"worker", "--task-timeout", "1000000h"}, "--task-timeout"},
		{"negative sync interval", []string{"run", "--sync-interval", "-1s", "--data", t.TempDir()}, "--sync-interval"},
		{"negative lease ttl", []string{"lease", "run", "cam1", "--ttl", "-5s", "--", "true"}, "--ttl"},
		{"eternal lease ttl", []string{"lease", "acquire", "cam1", "--owner", "o", "--ttl", "1000h"}, "--ttl"},
		{"negative misfire threshold", []string{"scheduler", "--misfire-threshold", "-1m"}, "--misfire-threshold"},
		{"negative wait timeout", []string{"submit", "noop", "--wait", "--wait-timeout", "-1s"}, "--wait-timeout"},
		{"negative client timeout", []string{"task", "ls", "--timeout", "-1s"}, "--timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append(tc.args, "--server", "nats://127.0.0.1:1")
			code, _, stderr := runInProcess(t, args...)
			if code != exitUsage || !strings.Contains(stderr, tc.flag) {
				t.Errorf("gantry %v = exit %d, stderr %q; want exit %d naming %s", tc.args, code, stderr, exitUsage, tc.flag)
			}
		})
	}
}

// TestTinySyncIntervalRefused: a 1ns sync interval used to panic inside
// nats-server once the broker created a stream (a panic exits 2 too: the
// test looks for the flag in the message).
func TestTinySyncIntervalRefused(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"1ns", "1ms"} {
		c := gantryCmd(t, "broker", "--sync-interval", v, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--log-format", "json")
		var stderr bytes.Buffer
		c.Stderr = &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		code := exitOf(t, c)
		if code != exitUsage || !strings.Contains(stderr.String(), "--sync-interval") || strings.Contains(stderr.String(), "panic") {
			t.Errorf("broker --sync-interval %s = exit %d, stderr %q; want exit 2 naming --sync-interval, no panic", v, code, stderr.String())
		}
	}
}

// TestBadDurationSettings: the config file's durations are held to ranges
// too.
func TestBadDurationSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, yaml, want string }{
		{"negative route interval", "routes:\n  - {id: r, probe_url: 'http://127.0.0.1:1/', interval: -5s}\n", "interval"},
		{"negative job jitter", "jobs:\n  - {name: j, type: noop, every: 1m, jitter: -1s}\n", "jitter"},
		{"negative task retention", "workers:\n  task_retention: -1h\n", "task_retention"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "gantry.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := runInProcess(t, "run", "--config", path, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("run with %s = exit %d, stderr %q; want exit 2 naming %s", tc.name, code, stderr, tc.want)
			}
		})
	}
}

func TestDurationRangeString(t *testing.T) {
	t.Parallel()
	if got, want := (durationRange{time.Second, time.Hour}).String(), "1s to 1h0m0s"; got != want {
		t.Errorf("range = %q, want %q", got, want)
	}
}
