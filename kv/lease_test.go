package kv_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
)

// setup starts a broker and returns a lease store on it.
func setup(t *testing.T) (*brokertest.Env, *kv.Leases) {
	t.Helper()
	env := brokertest.Start(t)
	l, err := kv.NewLeases(env.JS, kv.LeasesConfig{Audit: audit.NewEmitter(env.JS, "test", nil), Logger: env.Log})
	if err != nil {
		t.Fatal(err)
	}
	return env, l
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAcquireConflictRelease(t *testing.T) {
	t.Parallel()
	_, l := setup(t)
	ctx := testCtx(t)
	a, err := l.Acquire(ctx, "cam1", "alice", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.Owner != "alice" || a.Revision == 0 {
		t.Errorf("lease = %+v, want owner alice and a revision", a)
	}
	_, err = l.Acquire(ctx, "cam1", "bob", 10*time.Second)
	var ce *kv.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("second acquire err = %v, want a *ConflictError", err)
	}
	if ce.Holder != "alice" || !ce.ExpiresAt.Equal(a.ExpiresAt) {
		t.Errorf("conflict = %+v, want holder alice expiring %v", ce, a.ExpiresAt)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, "cam1", "bob", 10*time.Second)
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if err := l.Release(ctx, a); !errors.Is(err, kv.ErrLeaseLost) || !errors.Is(err, kv.ErrConflict) {
		t.Errorf("stale release err = %v, want ErrLeaseLost and ErrConflict", err)
	}
	got, err := l.Get(ctx, "cam1")
	if err != nil || got.Owner != "bob" || got.Revision != b.Revision {
		t.Errorf("Get = %+v, %v; want bob's lease at revision %d", got, err, b.Revision)
	}
}

func TestHundredRoundsOneWinner(t *testing.T) {
	t.Parallel()
	_, l := setup(t)
	ctx := testCtx(t)
	for round := range 100 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		wins := make(chan string, 2)
		for _, owner := range []string{"a", "b"} {
			wg.Go(func() {
				<-start
				lease, err := l.Acquire(ctx, "dev", owner, 5*time.Second)
				switch {
				case err == nil:
					wins <- lease.Owner
				case !errors.Is(err, kv.ErrConflict):
					t.Errorf("round %d: acquire %s: %v", round, owner, err)
				}
			})
		}
		close(start)
		wg.Wait()
		close(wins)
		var winners []string
		for w := range wins {
			winners = append(winners, w)
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: winners = %v, want exactly one", round, winners)
		}
		cur, err := l.Get(ctx, "dev")
		if err != nil || cur.Owner != winners[0] {
			t.Fatalf("round %d: holder = %+v, %v; want %s", round, cur, err, winners[0])
		}
		if err := l.Release(ctx, cur); err != nil {
			t.Fatal(err)
		}
	}
}
