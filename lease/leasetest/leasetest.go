// Package leasetest holds the test helpers that watch the lease domain from
// outside; the tests of lease and workers share them.
package leasetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/lease"
)

// WaitLine polls until n wait in line for resource id, and returns the
// line.
func WaitLine(t testing.TB, r *lease.Resources, id string, n int) []wire.Waiter {
	t.Helper()
	var line []wire.Waiter
	check.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		res, err := r.Get(context.Background(), id)
		if err != nil {
			return err
		}
		if line = res.Waiters; len(line) != n {
			return fmt.Errorf("waiting for %s = %d, want %d", id, len(line), n)
		}
		return nil
	})
	return line
}
