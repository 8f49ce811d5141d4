package tasks_test

import (
	"context"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/tasks"
)

func TestReleaseKey(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := tasks.NewCheckpointStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if owner, err := s.ClaimKey(ctx, "nightly", "a", time.Hour); owner != "a" || err != nil {
		t.Fatalf("ClaimKey(a) = %q, %v; want a", owner, err)
	}
	// Another task's release leaves a's claim alone.
	if err := s.ReleaseKey(ctx, "nightly", "b"); err != nil {
		t.Fatalf("ReleaseKey(b) = %v, want nil", err)
	}
	if owner, err := s.ClaimKey(ctx, "nightly", "b", time.Hour); owner != "a" || err != nil {
		t.Errorf("ClaimKey(b) after b's release = %q, %v; want a (still a's)", owner, err)
	}
	if err := s.ReleaseKey(ctx, "nightly", "a"); err != nil {
		t.Fatalf("ReleaseKey(a) = %v, want nil", err)
	}
	if owner, err := s.ClaimKey(ctx, "nightly", "b", time.Hour); owner != "b" || err != nil {
		t.Errorf("ClaimKey(b) after a's release = %q, %v; want b", owner, err)
	}
	// Releasing a key nobody claimed is not an error.
	if err := s.ReleaseKey(ctx, "never", "a"); err != nil {
		t.Errorf("ReleaseKey(never) = %v, want nil", err)
	}
}
