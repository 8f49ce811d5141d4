package proctree

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// helperEnv names the role a re-executed test binary plays instead of
// running the tests.
const helperEnv = "GANTRY_PROCTREE_HELPER"

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(helper(role))
	}
	goleak.VerifyTestMain(m)
}

// helper plays a role in a test that needs a process of its own. "parent"
// starts `sleep 300` as a tree, writes its pid to $PIDFILE and waits for
// it, so that a test can kill the parent and watch what becomes of the
// child.
func helper(role string) int {
	if role != "parent" {
		fmt.Fprintf(os.Stderr, "unknown helper role %q\n", role)
		return 2
	}
	cmd := exec.Command("sleep", "300")
	tree, err := Start(cmd)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(os.Getenv("PIDFILE"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = tree.Kill()
	}
	_ = tree.Wait()
	return 1
}
