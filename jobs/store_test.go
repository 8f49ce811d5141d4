package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/kv"
)

func TestJobStore(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	s, err := jobs.NewStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	j := wire.Job{Name: "b", Type: "noop", Every: "1m"}
	if _, err := s.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, j); !errors.Is(err, jobs.ErrExists) {
		t.Errorf("second Create = %v, want ErrJobExists", err)
	}
	if _, err := s.Create(ctx, wire.Job{Name: "a", Type: "exec", Cron: "* * * * *"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Modify(ctx, "b", func(j *wire.Job) error { j.Paused = true; return nil })
	if err != nil || !got.Paused {
		t.Fatalf("Modify = %+v, %v, want paused", got, err)
	}
	_, rev, err := s.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, j, rev-1); !errors.Is(err, kv.ErrChanged) {
		t.Errorf("Update at a stale revision = %v, want kv.ErrChanged", err)
	}
	list, bad, err := s.List(ctx)
	if err != nil || len(bad) != 0 || len(list) != 2 || list[0].Name != "a" || !list[1].Paused {
		t.Errorf("List = %+v, %v, %v, want a then paused b", list, bad, err)
	}
	if err := s.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "no.such"} {
		if _, _, err := s.Get(ctx, name); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrJobNotFound", name, err)
		}
		if err := s.Delete(ctx, name); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("Delete(%q) = %v, want ErrJobNotFound", name, err)
		}
	}
}

func TestSchedulerLeaderLease(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	s, err := jobs.NewSchedulerStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	now := time.Now()
	a, rev, err := s.Campaign(ctx, "a", "host-a", now, ttl)
	if err != nil || a.Term != 1 {
		t.Fatalf("Campaign = %+v, %v, want term 1", a, err)
	}
	if _, _, err := s.Campaign(ctx, "b", "host-b", now, ttl); !errors.Is(err, jobs.ErrLeaderHeld) {
		t.Errorf("Campaign while held = %v, want ErrLeaderHeld", err)
	}
	// Renewals keep the key alive past its TTL: a witness key put with the
	// same TTL after the campaign expires while the leader renews, so the
	// broker's own clock says the campaign's TTL has passed.
	if _, err := s.KeyValue().Create(ctx, "witness", nil, jetstream.KeyTTL(ttl)); err != nil {
		t.Fatal(err)
	}
	check.For(t, 10*time.Second, ttl/4, func() error {
		if rev, err = s.Renew(ctx, a, rev, ttl); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if _, err := s.KeyValue().Get(ctx, "witness"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("Get(witness) error = %v, want ErrKeyNotFound once its %v TTL has passed", err, ttl)
		}
		return nil
	})
	if l, _, err := s.Leader(ctx); err != nil || l.ID != "a" {
		t.Fatalf("Leader after renewals = %+v, %v, want a", l, err)
	}
	if _, err := s.Renew(ctx, a, rev-1, ttl); err == nil {
		t.Error("Renew at a stale revision = nil, want an error")
	}
	// Without renewal the broker expires the key; the next leader gets a
	// higher term.
	check.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if l, _, err := s.Leader(ctx); !errors.Is(err, jobs.ErrNoLeader) {
			return fmt.Errorf("Leader = %+v, %v after the TTL without renewal, want ErrNoLeader", l, err)
		}
		return nil
	})
	if _, err := s.Renew(ctx, a, rev, ttl); err == nil {
		t.Error("Renew of an expired lease = nil, want an error")
	}
	b, rev, err := s.Campaign(ctx, "b", "host-b", now, ttl)
	if err != nil || b.Term != 2 {
		t.Fatalf("Campaign after expiry = %+v, %v, want term 2", b, err)
	}
	if err := s.Resign(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if c, _, err := s.Campaign(ctx, "c", "host-c", now, ttl); err != nil || c.Term != 3 {
		t.Errorf("Campaign after resign = %+v, %v, want term 3", c, err)
	}
}

func TestSchedulerStateRunsCooldowns(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	s, err := jobs.NewSchedulerStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	put := func(m *nats.Msg, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	put(s.StateMsg(wire.JobState{Job: "a", LastPlanned: t0}))
	for i := range 3 {
		put(s.RunMsg(wire.JobRun{Job: "a", TaskID: wire.JobTaskID("a", t0.Add(time.Duration(i)*time.Minute)),
			Planned: t0.Add(time.Duration(i) * time.Minute), State: wire.TaskWaiting}, time.Hour))
	}
	put(s.RunMsg(wire.JobRun{Job: "ab", Planned: t0}, 0))
	put(s.CooldownMsg("cam 1/ü", t0.Add(time.Minute)))
	st, err := s.State(ctx, "a")
	if err != nil || !st.LastPlanned.Equal(t0) {
		t.Errorf("State = %+v, %v, want last planned %s", st, err, t0)
	}
	if st, err := s.State(ctx, "never"); err != nil || !st.LastPlanned.IsZero() {
		t.Errorf("State of a job never fired = %+v, %v, want zero", st, err)
	}
	runs, err := s.Runs(ctx, "a", 2)
	if err != nil || len(runs) != 2 || !runs[0].Planned.Equal(t0.Add(time.Minute)) {
		t.Errorf("Runs(a, 2) = %+v, %v, want the latest two, oldest first (and not job ab's)", runs, err)
	}
	if _, err := s.Run(ctx, "a", t0.Add(time.Hour)); !errors.Is(err, jobs.ErrRunNotFound) {
		t.Errorf("Run of a missing planned time = %v, want ErrRunNotFound", err)
	}
	c, err := s.Cooldowns(ctx)
	if err != nil || !c["cam 1/ü"].Equal(t0.Add(time.Minute)) {
		t.Errorf("Cooldowns = %v, %v, want cam 1/ü until %s", c, err, t0.Add(time.Minute))
	}
	if err := s.DeleteState(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if all, err := s.States(ctx); err != nil || len(all) != 0 {
		t.Errorf("States after delete = %v, %v, want none", all, err)
	}
}
