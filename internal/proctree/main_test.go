package proctree

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/leaktest"
)

// helperEnv names the role a re-executed test binary plays instead of
// running the tests.
const helperEnv = "GANTRY_PROCTREE_HELPER"

func TestMain(m *testing.M) {
	// The test binary is the shim of the Subreaper trees the tests start.
	ShimMain()
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(helper(role))
	}
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// helper plays a role in a test that needs a process of its own. "parent"
// starts $SCRIPT with sh as a tree contained by $CONTAINMENT and waits for
// it, so that a test can kill the parent and watch what becomes of the
// tree.
func helper(role string) int {
	if role != "parent" {
		fmt.Fprintf(os.Stderr, "unknown helper role %q\n", role)
		return 2
	}
	shim, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := New(Config{Containment: Containment(os.Getenv("CONTAINMENT")), Shim: shim})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tree, err := s.Start(exec.Command("sh", "-c", os.Getenv("SCRIPT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = tree.Wait()
	return 1
}
