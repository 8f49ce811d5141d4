package lease_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/lease"
)

// TestConflictsCoalesced: 32 contenders polling a held resource as fast as
// they can record one LEASE_CONFLICT each per window, whose counts add up
// to every conflict they met once the store is flushed.
func TestConflictsCoalesced(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := leaseCtx(t)
	l, err := lease.NewLeases(env.JS, lease.LeasesConfig{Audit: audit.NewEmitter(env.JS, "test", nil), Logger: env.Log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "cam1", "holder", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	for i := range 32 {
		wg.Go(func() {
			for range 20 {
				_, err := l.Acquire(ctx, "cam1", fmt.Sprintf("contender-%d", i), 30*time.Second)
				if !errors.Is(err, lease.ErrConflict) {
					t.Errorf("acquire of a held resource = %v, want ErrConflict", err)
					return
				}
				mu.Lock()
				total++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs := auditEvents(t, env, wire.EventLeaseConflict, "cam1")
	counted := 0
	for _, ev := range evs {
		var p struct {
			Count int    `json:"count"`
			Owner string `json:"owner"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil || p.Count < 1 {
			t.Fatalf("LEASE_CONFLICT payload %s: want a count", ev.Payload)
		}
		counted += p.Count
	}
	if len(evs) > 2*32 || counted != total {
		t.Errorf("LEASE_CONFLICT events = %d counting %d conflicts; want at most %d, counting all %d", len(evs), counted, 2*32, total)
	}
}

// TestConflictWindow: within a window one owner's conflicts on a resource
// make one event; the next conflict after it reports how many there were,
// and an acquire reports those not yet reported.
func TestConflictWindow(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := leaseCtx(t)
	clk := clock.NewFake(time.Now())
	l, err := lease.NewLeases(env.JS, lease.LeasesConfig{Audit: audit.NewEmitter(env.JS, "test", clk), Logger: env.Log, Clock: clk, ConflictWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.Acquire(ctx, "cam1", "alice", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conflict := func() {
		t.Helper()
		if _, err := l.Acquire(ctx, "cam1", "bob", 30*time.Second); !errors.Is(err, lease.ErrConflict) {
			t.Fatalf("bob's acquire = %v, want ErrConflict", err)
		}
	}
	counts := func() []float64 {
		t.Helper()
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		var out []float64
		for _, ev := range auditEvents(t, env, wire.EventLeaseConflict, "cam1") {
			var p map[string]any
			_ = json.Unmarshal(ev.Payload, &p)
			out = append(out, p["count"].(float64))
		}
		return out
	}
	for range 3 {
		conflict()
	}
	clk.Advance(time.Minute)
	conflict()
	conflict()
	if err := l.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "cam1", "bob", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(counts()), fmt.Sprint([]float64{1, 3, 1}); got != want {
		t.Errorf("LEASE_CONFLICT counts = %s, want %s (the first, the next window's with the two before it, the one before the acquire)", got, want)
	}
}
