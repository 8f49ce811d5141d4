package tasks_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }
