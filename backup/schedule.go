package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
)

// partialSuffix marks a backup directory under way under a parent.
const partialSuffix = ".partial"

// stampLayout is the time in the names of backups under a parent: UTC,
// sorting as the times do.
const stampLayout = "20060102T150405.000Z"

// Rotated is what TakeUnder did.
type Rotated struct {
	// Dir is the backup's directory.
	Dir string `json:"dir"`
	// Manifest is its manifest.
	Manifest wire.BackupManifest `json:"manifest"`
	// Again is set when the task named in Config.TaskID had already taken
	// it: nothing new was taken.
	Again bool `json:"again,omitempty"`
	// Removed are the older backups removed to keep the newest.
	Removed []string `json:"removed"`
}

// TakeUnder takes a backup (as Take) into a new directory under parent,
// named wire.BackupDirPrefix and the UTC time, then removes the oldest
// backups there beyond keep (0 keeps every one). It is what a backup task
// runs, so that scheduled backups are a job.
//
// The backup is written under a ".partial" name and renamed once whole;
// partial directories left by a run that died are removed first (so run
// one backup job per directory). When cfg.TaskID names a task whose backup
// is already there (the task was delivered again, or is run again on a
// system restored from that very backup), TakeUnder takes none and reports
// that one.
func TakeUnder(ctx context.Context, nc *nats.Conn, parent string, keep int, cfg Config) (Rotated, error) {
	if parent == "" {
		return Rotated{}, fmt.Errorf("%w: no directory to back up into", ErrInvalid)
	}
	if keep < 0 {
		return Rotated{}, fmt.Errorf("%w: keep %d: want 0 (keep every backup) or more", ErrInvalid, keep)
	}
	if err := os.MkdirAll(parent, 0o750); err != nil {
		return Rotated{}, fmt.Errorf("create backup dir: %w", err)
	}
	names, err := backupsUnder(parent)
	if err != nil {
		return Rotated{}, err
	}
	if cfg.TaskID != "" {
		for _, name := range names {
			m, err := readManifest(filepath.Join(parent, name))
			if err == nil && m.TaskID == cfg.TaskID {
				removed, err := prune(parent, keep)
				return Rotated{Dir: filepath.Join(parent, name), Manifest: m, Again: true, Removed: removed}, err
			}
		}
	}
	if err := removePartials(parent); err != nil {
		return Rotated{}, err
	}
	name := wire.BackupDirPrefix + time.Now().UTC().Format(stampLayout)
	final := filepath.Join(parent, name)
	if _, err := os.Stat(final); err == nil {
		return Rotated{}, fmt.Errorf("backup %s exists already", final)
	}
	partial := final + partialSuffix
	m, err := Take(ctx, nc, partial, cfg)
	if err != nil {
		return Rotated{}, err
	}
	if err := os.Rename(partial, final); err != nil {
		return Rotated{}, fmt.Errorf("complete backup %s: %w", final, err)
	}
	removed, err := prune(parent, keep)
	return Rotated{Dir: final, Manifest: m, Removed: removed}, err
}

// backupsUnder lists the names of the whole backups under parent (their
// manifest is there), oldest first.
func backupsUnder(parent string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil, fmt.Errorf("list backups: %w", err)
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, wire.BackupDirPrefix) || strings.HasSuffix(name, partialSuffix) {
			continue
		}
		if _, err := os.Stat(filepath.Join(parent, name, wire.BackupManifestFile)); err == nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// prune removes the oldest whole backups under parent beyond keep.
func prune(parent string, keep int) ([]string, error) {
	removed := []string{}
	if keep == 0 {
		return removed, nil
	}
	names, err := backupsUnder(parent)
	if err != nil {
		return removed, err
	}
	for _, name := range names[:max(len(names)-keep, 0)] {
		dir := filepath.Join(parent, name)
		if err := os.RemoveAll(dir); err != nil {
			return removed, fmt.Errorf("remove old backup: %w", err)
		}
		removed = append(removed, dir)
	}
	return removed, nil
}

// removePartials removes the partial backups a run that died left under
// parent.
func removePartials(parent string) error {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return fmt.Errorf("list backups: %w", err)
	}
	for _, e := range entries {
		if name := e.Name(); e.IsDir() && strings.HasPrefix(name, wire.BackupDirPrefix) && strings.HasSuffix(name, partialSuffix) {
			if err := os.RemoveAll(filepath.Join(parent, name)); err != nil {
				return fmt.Errorf("remove partial backup: %w", err)
			}
		}
	}
	return nil
}

// readManifest reads the manifest of the backup in dir, unchecked.
func readManifest(dir string) (wire.BackupManifest, error) {
	var m wire.BackupManifest
	data, err := os.ReadFile(filepath.Join(dir, wire.BackupManifestFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, errors.New("unreadable manifest")
	}
	return m, nil
}
