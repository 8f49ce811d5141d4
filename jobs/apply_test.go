package jobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/jobs"
)

func TestApplyKeepsOperatorPause(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	store, err := jobs.NewStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	def := wire.Job{Name: "cfg", Type: "noop", Every: "1m", Source: wire.JobSourceConfig}
	if _, err := jobs.Apply(ctx, store, def, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Modify(ctx, "cfg", func(j *wire.Job) error { j.Paused = true; return nil }); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := store.Get(ctx, "cfg")
	if _, err := jobs.Apply(ctx, store, def, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, rev2, _ := store.Get(ctx, "cfg"); rev2 != rev {
		t.Errorf("revision after applying an unchanged job = %d, want %d (no write)", rev2, rev)
	}
	def.Every = "2m"
	got, err := jobs.Apply(ctx, store, def, t0.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	j, _, _ := store.Get(ctx, "cfg")
	if j.Every != "2m" || !j.Paused || j.Source != wire.JobSourceConfig || !j.CreatedAt.Equal(t0) {
		t.Errorf("job after a change = every %s paused %v source %s created %s, want 2m, still paused, config, %s",
			j.Every, j.Paused, j.Source, j.CreatedAt, t0)
	}
	if !jobs.SameDefinition(got, j) || got.Paused != j.Paused {
		t.Errorf("Apply returned %+v, want the stored %+v", got, j)
	}
}

func TestApplyRefusesInvalid(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	store, err := jobs.NewStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	_, err = jobs.Apply(ctx, store, wire.Job{Name: "bad", Type: "noop", Cron: "TZ=UTC"}, time.Now())
	if !errors.Is(err, jobs.ErrInvalid) {
		t.Fatalf("Apply of cron TZ=UTC = %v, want ErrInvalid", err)
	}
	if _, _, err := store.Get(ctx, "bad"); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("Get after a refused Apply = %v, want ErrNotFound (nothing written)", err)
	}
}
