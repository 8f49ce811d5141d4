package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestNew(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := New(&buf, FormatAuto, "debug")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("ready", "component", "broker")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("auto format off a terminal = %q, want JSON: %v", buf.String(), err)
	}
	if line["msg"] != "ready" || line["component"] != "broker" {
		t.Errorf("line = %v, want msg ready, component broker", line)
	}

	buf.Reset()
	log, err = New(&buf, FormatText, "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", "v")
	if got := buf.String(); strings.Contains(got, "hidden") || !strings.Contains(got, "shown") || !strings.Contains(got, "k=v") {
		t.Errorf("text at warn = %q, want only the warning with k=v", got)
	}

	if _, err := New(&buf, "xml", "info"); err == nil {
		t.Error("New(format xml) = nil error, want one")
	}
	if _, err := New(&buf, FormatJSON, "loud"); err == nil {
		t.Error("New(level loud) = nil error, want one")
	}
}

// TestDurations: durations read "30s", not 30000000000; text rounds them
// for people, JSON keeps them exact.
func TestDurations(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := New(&buf, FormatText, "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("consuming", "ack_wait", 30*time.Second, "retry_in", 3*time.Minute+59953555092*time.Nanosecond)
	if got := buf.String(); !strings.Contains(got, "ack_wait=30s") || !strings.Contains(got, "retry_in=4m0s") {
		t.Errorf("text line = %q, want ack_wait=30s and retry_in=4m0s", got)
	}
	buf.Reset()
	if log, err = New(&buf, FormatJSON, "info"); err != nil {
		t.Fatal(err)
	}
	log.Info("consuming", "ack_wait", 30*time.Second, "took", 1234567*time.Microsecond)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if line["ack_wait"] != "30s" || line["took"] != "1.234567s" {
		t.Errorf("JSON ack_wait, took = %v, %v; want \"30s\", \"1.234567s\"", line["ack_wait"], line["took"])
	}
}
