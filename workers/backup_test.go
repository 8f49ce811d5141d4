package workers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/backup"
	"github.com/gantry-dev/gantry/broker/wire"
)

func TestBackupTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy}, nil)
	dir := t.TempDir()
	for _, id := range []string{"bk-1", "bk-2"} {
		b.publish(t, wire.TaskSubject("", "backup"), wire.Task{ID: id, Payload: jsonOf(t, wire.BackupPayload{Dir: dir, Keep: 1, NoAudit: true})})
		rec := b.waitState(t, id, wire.TaskSucceeded, 20*time.Second)
		if !strings.Contains(rec.Output, filepath.Join(dir, wire.BackupDirPrefix)) {
			t.Errorf("%s output = %q, want the backup's dir", id, rec.Output)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("backups under dir = %d, want 1 (keep 1)", len(entries))
	}
	v, err := backup.Verify(filepath.Join(dir, entries[0].Name()))
	if err != nil {
		t.Fatalf("Verify the kept backup: %v", err)
	}
	if v.Manifest.TaskID != "bk-2" {
		t.Errorf("kept backup taken by %q, want bk-2 (the newest)", v.Manifest.TaskID)
	}

	for id, body := range map[string]any{
		"bk-relative": wire.BackupPayload{Dir: "backups"},
		"bk-no-dir":   wire.BackupPayload{Keep: 2},
		"bk-keep":     wire.BackupPayload{Dir: dir, Keep: -1},
		"bk-unknown":  map[string]any{"dir": dir, "kep": 2},
	} {
		b.publish(t, wire.TaskSubject("", "backup"), wire.Task{ID: id, Payload: jsonOf(t, body)})
		if rec := b.waitState(t, id, wire.TaskNeedsReview, 20*time.Second); rec.Attempts != 1 {
			t.Errorf("%s attempts = %d, want 1 (a bad payload is permanent)", id, rec.Attempts)
		}
	}
}

// jsonOf returns v as JSON.
func jsonOf(t *testing.T, v any) json.RawMessage {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
