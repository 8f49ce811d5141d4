package workers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// checkpointDir names a Workers' own directory of checkpoint files under
// dir: <pid>-<random>, so that a later worker process can tell whether
// its maker is gone. The name is absolute: a task's process may run in
// another directory.
func checkpointDir(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("checkpoint dir: %w", err)
	}
	return filepath.Join(dir, strconv.Itoa(os.Getpid())+"-"+strconv.FormatUint(rand.Uint64(), 36)), nil
}

// makeCheckpointDir removes the checkpoint directories of worker
// processes that are gone, then makes this Workers' own.
func (w *Workers) makeCheckpointDir() error {
	parent := filepath.Dir(w.cpDir)
	entries, err := os.ReadDir(parent)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	for _, e := range entries {
		p, _, ok := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(p)
		if !ok || err != nil || !e.IsDir() || !processGone(pid) {
			continue
		}
		path := filepath.Join(parent, e.Name())
		if err := os.RemoveAll(path); err != nil {
			w.log.Warn("remove the checkpoint files of a worker that is gone", "dir", path, "err", err)
			continue
		}
		w.log.Info("removed the checkpoint files of a worker that is gone", "dir", path)
	}
	if err := os.MkdirAll(w.cpDir, 0o700); err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	return nil
}

// processGone reports whether no process has the id pid. A pid reused by
// another process counts as not gone: its files wait for a later start.
func processGone(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		// Windows: no such process.
		return true
	}
	defer p.Release()
	if runtime.GOOS == "windows" {
		return false
	}
	return errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone)
}
