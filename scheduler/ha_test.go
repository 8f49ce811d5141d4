package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
)

func TestTwoSchedulersFireOncePerPlannedTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, _ := b.start(Config{ID: "a"}, true)
	other, _ := b.start(Config{ID: "b"}, false)
	b.addJob(wire.Job{Name: "ha", Type: "noop", Every: "1m"})
	b.addJob(wire.Job{Name: "ha2", Type: "noop", Every: "1m"})
	for i := 1; i <= 5; i++ {
		b.advance(time.Minute)
		b.waitTasks(2 * i)
	}
	// One of them leads; on a machine loaded past the leader TTL the lead
	// may have passed to b, which must not have fired anything twice.
	la, termA := a.Leading()
	lb, termB := other.Leading()
	if la == lb || max(termA, termB) == 0 {
		t.Errorf("a leading %v term %d, b leading %v term %d; want exactly one leader, with a term", la, termA, lb, termB)
	}
	seen := map[string]bool{}
	for _, m := range b.taskMsgs() {
		if seen[m.id] {
			t.Errorf("task %s published twice", m.id)
		}
		seen[m.id] = true
	}
	if got := len(b.events(wire.EventJobFired)); got != 10 {
		t.Errorf("JOB_FIRED = %d, want 10", got)
	}
}

func TestLeaderKilledFollowerTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = 2 * time.Second
	cfg := Config{LeaderTTL: ttl, MisfireThreshold: 10 * time.Minute}
	cfg.ID = "a"
	a, _, anc := b.startConn(cfg, true)
	cfg.ID = "b"
	follower, _ := b.start(cfg, false)
	b.addJob(wire.Job{Name: "ha", Type: "noop", Every: "1m"})
	for i := 1; i <= 3; i++ {
		b.advance(time.Minute)
		b.waitTasks(i)
	}
	_, termA := a.Leading()
	// Kill the leader: its connection dies, it can neither renew nor
	// resign. Then pretend it died before saving its last two fires, so
	// that its successor plans them again.
	check.For(t, 15*time.Second, 10*time.Millisecond, func() error {
		want := t0.Add(3 * time.Minute)
		if st, err := b.st.State(context.Background(), "ha"); err != nil || !st.LastPlanned.Equal(want) {
			return fmt.Errorf("State(ha) LastPlanned = %s, %v; want the third fire %s saved", st.LastPlanned, err, want)
		}
		return nil
	})
	b.waitEvents(wire.EventJobFired, 3)
	anc.Close()
	killed := time.Now()
	b.putState(wire.JobState{Job: "ha", LastPlanned: t0.Add(time.Minute)})
	// Two planned times pass while nobody leads.
	b.clk.Advance(2 * time.Minute)
	b.waitLeading(follower, "b")
	took := time.Since(killed)
	t.Logf("takeover after %s (lease TTL %s)", took, ttl)
	// The broker expires the key at most a TTL after the last renewal;
	// the margin is for a loaded machine.
	if took > 2*ttl+3*time.Second {
		t.Errorf("takeover after %s, want within about the lease TTL %s", took, ttl)
	}
	if _, termB := follower.Leading(); termB <= termA {
		t.Errorf("new term %d, want above the old %d", termB, termA)
	}
	got := b.waitTasks(5)
	for i, m := range got {
		if want := wire.JobTaskID("ha", t0.Add(time.Duration(i+1)*time.Minute)); m.id != want {
			t.Errorf("task %d = %s, want %s", i, m.id, want)
		}
	}
	b.advance(time.Minute)
	b.waitTasks(6)
	// The re-planned 10:02 and 10:03 were dropped by the broker as
	// duplicates: one JOB_FIRED per planned time.
	fired := map[string]int{}
	for _, ev := range b.waitEvents(wire.EventJobFired, 6) {
		fired[ev.TaskID]++
	}
	for id, n := range fired {
		if n != 1 {
			t.Errorf("JOB_FIRED for %s = %d, want 1", id, n)
		}
	}
	if len(fired) != 6 {
		t.Errorf("planned times fired = %d, want 6", len(fired))
	}
	if got := len(b.events(wire.EventLeaderElected)); got != 2 {
		t.Errorf("LEADER_ELECTED = %d, want 2", got)
	}
}

func TestGracefulStopHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := Config{LeaderTTL: 30 * time.Second}
	cfg.ID = "a"
	_, stopA := b.start(cfg, true)
	cfg.ID = "b"
	follower, _ := b.start(cfg, false)
	stopped := time.Now()
	stopA()
	b.waitLeading(follower, "b")
	if took := time.Since(stopped); took > 10*time.Second {
		t.Errorf("hand-over after %s, want well under the 30s TTL (the leader resigns)", took)
	}
}
