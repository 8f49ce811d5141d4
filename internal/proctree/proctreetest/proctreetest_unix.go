//go:build unix

package proctreetest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/check"
)

// Alive reports whether pid is a live process: not gone, not a zombie.
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		// No /proc (macOS, the BSDs): kill(2) said it is there.
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the ") " that ends the command name.
	i := bytes.LastIndex(stat, []byte(") "))
	return i < 0 || stat[i+2] != 'Z'
}

// WaitDead waits until every pid is gone, failing the test with why they
// should be; whatever the test finds, it kills those still alive.
func WaitDead(t testing.TB, why string, pids ...int) {
	t.Helper()
	t.Cleanup(func() { kill(pids) })
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, pid := range pids {
			if Alive(pid) {
				return fmt.Errorf("process %d is alive, want it gone: %s", pid, why)
			}
		}
		return nil
	})
}

// ReadPids waits until path holds at least n pids, one a word, and returns
// them. The processes are killed when the test ends.
func ReadPids(t testing.TB, path string, n int) []int {
	t.Helper()
	var pids []int
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		data, _ := os.ReadFile(path)
		pids = pids[:0]
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			pids = append(pids, pid)
		}
		if len(pids) < n {
			return fmt.Errorf("%s holds %d pids, want %d", path, len(pids), n)
		}
		return nil
	})
	t.Cleanup(func() { kill(pids) })
	return pids
}

// kill kills the processes of pids that are still alive.
func kill(pids []int) {
	for _, pid := range pids {
		if Alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
