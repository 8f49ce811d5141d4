package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/lease/leasetest"
)

// waited is what a LeaseWait returned.
type waited struct {
	rh  *lease.ResourceHolder
	err error
	at  time.Time
}

// startWaiter runs LeaseWait in the background; its result comes on the
// channel.
func startWaiter(ctx context.Context, r *lease.Resources, id, owner string, opts lease.WaitOptions) <-chan waited {
	out := make(chan waited, 1)
	go func() {
		rh, err := r.LeaseWait(ctx, id, owner, 10*time.Second, opts)
		out <- waited{rh: rh, err: err, at: time.Now()}
	}()
	return out
}

// got waits for a waiter's result.
func got(t *testing.T, c <-chan waited, within time.Duration) waited {
	t.Helper()
	select {
	case w := <-c:
		return w
	case <-time.After(within):
		t.Fatalf("waiter not done within %v", within)
	}
	return waited{}
}

func TestLeaseWaitWakesOnRelease(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	holder, err := r.Lease(ctx, "cam1", "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []lease.WaitStatus
	// The waiter is another process: its own connection and store.
	other := newResources(t, env)
	c := startWaiter(ctx, other, "cam1", "bob", lease.WaitOptions{OnChange: func(s lease.WaitStatus) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s)
	}})
	line := leasetest.WaitLine(t, r, "cam1", 1)
	if line[0].Owner != "bob" || line[0].Arrived == nil {
		t.Errorf("line = %+v, want bob with an arrival time", line)
	}
	if res := resourceOf(t, r, "cam1"); res.LeaseUntil == nil || res.LeaseOwner != "alice" {
		t.Errorf("resource = %+v, want alice's live lease", res.Resource)
	}
	released := time.Now()
	if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	w := got(t, c, 10*time.Second)
	if w.err != nil {
		t.Fatalf("LeaseWait = %v", w.err)
	}
	t.Logf("release -> leased: %v", w.at.Sub(released))
	if l := w.rh.Lease(); l.Owner != "bob" {
		t.Errorf("lease owner = %q, want bob", l.Owner)
	}
	if res := resourceOf(t, r, "cam1"); res.State != wire.ResourceLeased || res.LeaseOwner != "bob" || len(res.Waiters) != 0 {
		t.Errorf("resource = %+v with %d waiting, want LEASED by bob, nobody waiting", res.Resource, len(res.Waiters))
	}
	if err := w.rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	first := seen[0]
	mu.Unlock()
	if first.Holder != "alice" || first.Position != 1 || first.Waiting != 1 || first.State != wire.ResourceLeased {
		t.Errorf("first status = %+v, want held by alice, 1st of 1, LEASED", first)
	}
	if s := first.String(); !strings.Contains(s, "held by alice until") || !strings.Contains(s, "1st of 1 in line") {
		t.Errorf("status = %q, want the holder and the place", s)
	}
	if err := other.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs := waitEvents(t, env, wire.EventResourceWaiting, "cam1", 1)
	if !strings.Contains(evs[0].Message, "bob waits in line for cam1, held by alice") {
		t.Errorf("RESOURCE_WAITING message = %q, want bob waiting behind alice", evs[0].Message)
	}
}

func TestLeaseWaitOrder(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	holder, err := r.Lease(ctx, "cam1", "holder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// Joining in another order than their places: the places decide.
	places := []struct {
		owner string
		place lease.Place
	}{
		{"c", lease.Place{Arrived: t0.Add(2 * time.Millisecond), Seq: 3}},
		{"a", lease.Place{Arrived: t0, Seq: 1}},
		{"urgent", lease.Place{Priority: 5, Arrived: t0.Add(3 * time.Millisecond), Seq: 4}},
		{"b", lease.Place{Arrived: t0.Add(time.Millisecond), Seq: 2}},
	}
	var order []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, p := range places {
		// Two processes, alternating.
		store := r
		if i%2 == 1 {
			store = newResources(t, env)
		}
		c := startWaiter(ctx, store, "cam1", p.owner, lease.WaitOptions{Place: p.place})
		leasetest.WaitLine(t, r, "cam1", i+1)
		wg.Go(func() {
			w := <-c
			if w.err != nil {
				t.Errorf("%s: LeaseWait = %v", p.owner, w.err)
				return
			}
			mu.Lock()
			order = append(order, p.owner)
			mu.Unlock()
			if err := w.rh.Finish(ctx, lease.Outcome{}); err != nil {
				t.Errorf("%s: Finish = %v", p.owner, err)
			}
		})
	}
	line := leasetest.WaitLine(t, r, "cam1", 4)
	var owners []string
	for _, w := range line {
		owners = append(owners, w.Owner)
	}
	if strings.Join(owners, ",") != "urgent,a,b,c" {
		t.Errorf("line = %v, want urgent,a,b,c", owners)
	}
	if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if strings.Join(order, ",") != "urgent,a,b,c" {
		t.Errorf("order leased = %v, want urgent,a,b,c", order)
	}
}

func TestLeaseWaitForEnable(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"}, lease.ResourceSpec{ID: "cam2"})
	if _, err := r.Disable(ctx, "cam1", "maintenance"); err != nil {
		t.Fatal(err)
	}
	// cam2 goes to FAULT under a holder.
	rh, err := r.Lease(ctx, "cam2", "w0", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := rh.Finish(ctx, lease.OutcomeOf(lease.Fault(errors.New("lens cracked")))); err != nil {
		t.Fatal(err)
	}
	var first lease.WaitStatus
	var once sync.Once
	c1 := startWaiter(ctx, r, "cam1", "w1", lease.WaitOptions{OnChange: func(s lease.WaitStatus) { once.Do(func() { first = s }) }})
	c2 := startWaiter(ctx, r, "cam2", "w2", lease.WaitOptions{})
	leasetest.WaitLine(t, r, "cam1", 1)
	leasetest.WaitLine(t, r, "cam2", 1)
	if got := resourceOf(t, r, "cam1").State; got != wire.ResourceDisabled {
		t.Errorf("cam1 state while waited for = %s, want DISABLED (a paused resource is not leased)", got)
	}
	for _, id := range []string{"cam1", "cam2"} {
		if _, err := r.Enable(ctx, id, "fixed"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []<-chan waited{c1, c2} {
		w := got(t, c, 10*time.Second)
		if w.err != nil {
			t.Fatalf("LeaseWait = %v", w.err)
		}
		if err := w.rh.Finish(ctx, lease.Outcome{}); err != nil {
			t.Fatal(err)
		}
	}
	if first.State != wire.ResourceDisabled || !strings.Contains(first.String(), "DISABLED, waiting to be enabled; 1st of 1 in line") {
		t.Errorf("status while disabled = %+v (%q), want DISABLED, 1st in line", first, first.String())
	}
}

func TestLeaseWaitTimesOut(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	holder, err := r.Lease(ctx, "cam1", "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Finish(ctx, lease.Outcome{}) }()
	start := time.Now()
	_, err = r.LeaseWait(ctx, "cam1", "bob", 10*time.Second, lease.WaitOptions{Timeout: 500 * time.Millisecond})
	var we *lease.WaitError
	if !errors.As(err, &we) || !errors.Is(err, lease.ErrConflict) || !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("LeaseWait = %v, want a *WaitError matching ErrConflict", err)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("gave up after %v, want at least the 500ms timeout", d)
	}
	if !strings.Contains(err.Error(), "gave up waiting for cam1 after") || !strings.Contains(err.Error(), "held by alice") {
		t.Errorf("error = %q, want the wait and the holder", err)
	}
	// The place is given up at once.
	if res := resourceOf(t, r, "cam1"); len(res.Waiters) != 0 {
		t.Errorf("waiting after the timeout = %d, want 0", len(res.Waiters))
	}
	// A wait cancelled is not a conflict.
	cctx, cancel := context.WithCancel(ctx)
	c := startWaiter(cctx, r, "cam1", "carol", lease.WaitOptions{})
	leasetest.WaitLine(t, r, "cam1", 1)
	cancel()
	if w := got(t, c, 10*time.Second); !errors.Is(w.err, context.Canceled) || errors.Is(w.err, lease.ErrConflict) {
		t.Errorf("cancelled LeaseWait = %v, want context.Canceled, not a conflict", w.err)
	}
}

func TestLeaseWaitExpiryAndCooldown(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"}, lease.ResourceSpec{ID: "cam2"})
	// A holder that dies: its lease is never renewed and lapses after 1s.
	if _, err := r.Leases().Acquire(ctx, "cam1", "dead", time.Second); err != nil {
		t.Fatal(err)
	}
	rh, err := r.Lease(ctx, "cam2", "w0", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := rh.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rh.Finish(ctx, lease.Outcome{Cooldown: time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"cam1", "cam2"} {
		w := got(t, startWaiter(ctx, r, id, "next", lease.WaitOptions{}), 10*time.Second)
		if w.err != nil {
			t.Fatalf("%s: LeaseWait = %v", id, w.err)
		}
		if res := resourceOf(t, r, id); res.State != wire.ResourceLeased || res.LeaseOwner != "next" {
			t.Errorf("%s = %+v, want LEASED by next", id, res.Resource)
		}
		if err := w.rh.Finish(ctx, lease.Outcome{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLeaseWaitDeadWaiterLapses(t *testing.T) {
	t.Parallel()
	env, r, ctx := setupResources(t, lease.ResourceSpec{ID: "cam1"})
	holder, err := r.Lease(ctx, "cam1", "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter that died after taking its place, first in line: its
	// ticket was last renewed with a 2s TTL.
	early := time.Now().Add(-time.Hour)
	data, err := json.Marshal(wire.Waiter{Resource: "cam1", Owner: "dead", Arrived: &early, TTL: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.PublishMsg(ctx, kv.Msg(wire.BucketWaiters, wire.WaiterKey("cam1", "dead"), data, 2*time.Second)); err != nil {
		t.Fatal(err)
	}
	c := startWaiter(ctx, r, "cam1", "bob", lease.WaitOptions{})
	line := leasetest.WaitLine(t, r, "cam1", 2)
	if line[0].Owner != "dead" {
		t.Fatalf("line = %+v, want the dead waiter first", line)
	}
	if err := holder.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	w := got(t, c, 10*time.Second)
	if w.err != nil {
		t.Fatalf("LeaseWait = %v", w.err)
	}
	if err := w.rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
}

func TestLeaseWaitNotNeeded(t *testing.T) {
	t.Parallel()
	_, r, ctx := setupResources(t)
	// Free, unregistered: leased at once, nobody in line.
	rh, err := r.LeaseWait(ctx, "plain", "alice", 10*time.Second, lease.WaitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rh.Registered() || rh.Lease().Owner != "alice" {
		t.Errorf("holder = registered %v, owner %q; want a plain lease of alice", rh.Registered(), rh.Lease().Owner)
	}
	if err := rh.Finish(ctx, lease.Outcome{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, owner string
		opts      lease.WaitOptions
	}{
		{"cam.1", "a", lease.WaitOptions{}},
		{"cam1", "", lease.WaitOptions{}},
		{"cam1", "a", lease.WaitOptions{Timeout: -time.Second}},
	} {
		if _, err := r.LeaseWait(ctx, tc.id, tc.owner, time.Second, tc.opts); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("LeaseWait(%q, %q, %+v) = %v, want ErrInvalid", tc.id, tc.owner, tc.opts, err)
		}
	}
}
