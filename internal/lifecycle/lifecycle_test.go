package lifecycle

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStop(t *testing.T) {
	t.Parallel()
	var s Stop
	if s.Stopped() {
		t.Fatal("Stopped = true before Stop")
	}
	ctx, cancel := s.Context(context.Background())
	defer cancel()
	s.Stop()
	s.Stop()
	if !s.Stopped() {
		t.Error("Stopped = false after Stop")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not cancelled by Stop")
	}

	// A context made after Stop is cancelled at once; one whose parent ends
	// first releases its goroutine (goleak checks).
	var late Stop
	late.Stop()
	ctx2, cancel2 := late.Context(context.Background())
	defer cancel2()
	select {
	case <-ctx2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context made after Stop not cancelled")
	}
	var never Stop
	parent, cancelParent := context.WithCancel(context.Background())
	ctx3, cancel3 := never.Context(parent)
	defer cancel3()
	cancelParent()
	<-ctx3.Done()
}
