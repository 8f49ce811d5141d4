package brokertest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// SmallDisk mounts a tmpfs of size (as mount takes it: "16m") on a new
// directory for the test and returns it; t.Cleanup unmounts it. Mounting
// needs root on Linux (CI runs as root): elsewhere the test is skipped,
// saying so loudly, since what it checks then goes unchecked.
func SmallDisk(t testing.TB, size string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED LOUDLY: a small disk needs a Linux tmpfs; %s has none here, so the full-disk behaviour is not tested", runtime.GOOS)
	}
	dir := filepath.Join(t.TempDir(), "small-disk")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("SKIPPED LOUDLY: cannot mount a %s tmpfs (%v: %s): the full-disk behaviour is not tested; run as root (CI does)", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// FillDisk writes a file into dir until its file system is full, and
// returns a function that removes it, freeing the space.
func FillDisk(t testing.TB, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	_ = f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("fill %s: %v, want the disk full", dir, err)
	}
	// What the page cache held back is full too.
	for _, size := range []int{4096, 512, 1} {
		g, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := g.Write(buf[:size]); err != nil {
				break
			}
		}
		_ = g.Close()
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Errorf("free the disk: %v", err)
		}
	}
}
