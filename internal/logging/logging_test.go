package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
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
