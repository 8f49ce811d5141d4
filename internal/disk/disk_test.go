package disk

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestFree(t *testing.T) {
	t.Parallel()
	if n, err := Free(t.TempDir()); err != nil || n == 0 {
		t.Errorf("Free(temp dir) = %d, %v; want some room", n, err)
	}
	if _, err := Free("/no/such/dir/at/all"); err == nil {
		t.Error("Free(missing dir) = nil error")
	}
}
