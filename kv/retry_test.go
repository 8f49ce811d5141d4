package kv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/kv"
)

func TestRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := 0
	err := kv.Retry(ctx, time.Second, func(ctx context.Context) error {
		calls++
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a try has no deadline, want one")
		}
		if calls < 3 {
			return nats.ErrTimeout
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("Retry of two time-outs then success = %v after %d calls, want nil after 3", err, calls)
	}
	calls = 0
	bad := errors.New("bad input")
	if err := kv.Retry(ctx, time.Second, func(context.Context) error { calls++; return bad }); !errors.Is(err, bad) || calls != 1 {
		t.Errorf("Retry of a lasting error = %v after %d calls, want it after 1", err, calls)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := kv.Retry(cctx, 50*time.Millisecond, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }); err == nil {
		t.Error("Retry past its context's end = nil, want an error")
	}
}

func TestTransient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrNoStreamResponse, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, true},
		{jetstream.ErrKeyExists, false},
		{kv.ErrInvalid, false},
	} {
		if got := kv.Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
