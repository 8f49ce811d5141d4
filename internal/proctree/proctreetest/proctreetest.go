// Package proctreetest holds the test helpers that watch processes from
// outside: whether a pid lives, waiting for a process tree to be gone, and
// reading the pids and marker files a test script writes. The tests of
// proctree, workers and cmd/gantry share them.
package proctreetest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/check"
)

// WaitFile waits until path exists.
func WaitFile(t testing.TB, path string) {
	t.Helper()
	check.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("%s not created: %v", path, err)
		}
		return nil
	})
}
