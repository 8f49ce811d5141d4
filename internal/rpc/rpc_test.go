package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/kv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

type echo struct {
	Fail string `json:"fail,omitempty"`
	Text string `json:"text,omitempty"`
}

// failures are the errors the test service answers with, by name.
var failures = map[string]error{
	"invalid":     fmt.Errorf("%w: text too long", kv.ErrInvalid),
	"not_found":   kv.Sentinel("widget not found", kv.ErrNotFound),
	"conflict":    kv.Sentinel("held by bob", kv.ErrConflict),
	"exists":      fmt.Errorf("widget: %w", kv.ErrExists),
	"unavailable": fmt.Errorf("store failed: %w", kv.ErrUnavailable),
	"internal":    errors.New("disk on fire\nsecond line"),
}

// answer is the test service's handler: the text it was sent, or the
// failure it names.
func answer(req micro.Request) {
	var in echo
	if err := Decode(req, &in); err != nil {
		_ = Respond(req, nil, err)
		return
	}
	_ = Respond(req, echo{Text: in.Text}, failures[in.Fail])
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	svc, err := AddService(env.NC, "gantry-test", "echo", Endpoint{
		Name: "echo", Subject: "test.echo",
		Handler: answer,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var got echo
	if err := Request(ctx, env.NC, "test.echo", echo{Text: "hi"}, &got); err != nil || got.Text != "hi" {
		t.Fatalf("Request = %+v, %v; want hi, nil", got, err)
	}
	for _, tc := range []struct {
		fail, code string
		is         error
	}{
		{"invalid", CodeInvalid, kv.ErrInvalid},
		{"not_found", CodeNotFound, kv.ErrNotFound},
		{"conflict", CodeConflict, kv.ErrConflict},
		{"exists", CodeConflict, kv.ErrConflict},
		{"unavailable", CodeUnavailable, kv.ErrUnavailable},
		{"internal", CodeInternal, nil},
	} {
		err := Request(ctx, env.NC, "test.echo", echo{Fail: tc.fail}, &got)
		var re *Error
		if !errors.As(err, &re) || re.Code != tc.code {
			t.Errorf("%s: error = %v, want code %s", tc.fail, err, tc.code)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: errors.Is(%v, %v) = false, want true", tc.fail, err, tc.is)
		}
		for _, other := range []error{kv.ErrInvalid, kv.ErrNotFound, kv.ErrConflict, kv.ErrUnavailable} {
			if other != tc.is && errors.Is(err, other) {
				t.Errorf("%s: errors.Is(%v, %v) = true, want false", tc.fail, err, other)
			}
		}
	}
	if err := Request(ctx, env.NC, "test.echo", echo{Fail: "internal"}, nil); err == nil || err.Error() != "disk on fire second line" {
		t.Errorf("internal error = %q, want the message on one line", err)
	}

	// A body that is not JSON is a 400, and no reply subject gets no answer.
	msg, err := env.NC.Request("test.echo", []byte("{not json"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != CodeInvalid || msg.Header.Get(micro.ErrorHeader) == "" {
		t.Errorf("Nats-Service-Error-Code = %q, want %s with a description", code, CodeInvalid)
	}
	if err := Request(ctx, env.NC, "test.echo", "not an object", nil); !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("wrong shape = %v, want kv.ErrInvalid", err)
	}
	if err := env.NC.Publish("test.echo", []byte(`{"fail":"internal"}`)); err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := Request(ctx, env.NC, "test.nobody", echo{}, nil); !errors.Is(err, ErrNoResponders) || !errors.Is(err, kv.ErrUnavailable) {
		t.Errorf("no responders = %v, want ErrNoResponders matching kv.ErrUnavailable", err)
	}
	info, err := env.NC.Request("$SRV.INFO.gantry-test", nil, 5*time.Second)
	if err != nil || len(info.Data) == 0 {
		t.Errorf("service info = %v, want the micro service's info", err)
	}
}

// TestEveryone checks that an endpoint for everyone reaches every
// instance, and that the one concerned answers.
func TestEveryone(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	seen := make(chan string, 4)
	for _, name := range []string{"a", "b", "c"} {
		svc, err := AddService(env.NC, "gantry-test", "fan-out", Endpoint{
			Name: "who", Subject: "test.who", Everyone: true,
			Handler: func(req micro.Request) {
				var in echo
				_ = Decode(req, &in)
				seen <- name
				if in.Text == name {
					_ = Respond(req, echo{Text: name}, nil)
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = svc.Stop() }()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got echo
	if err := Request(ctx, env.NC, "test.who", echo{Text: "b"}, &got); err != nil || got.Text != "b" {
		t.Fatalf("Request = %+v, %v; want b's answer", got, err)
	}
	for range 3 {
		select {
		case <-seen:
		case <-ctx.Done():
			t.Fatal("every instance = not reached, want all three to see the request")
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := Request(short, env.NC, "test.who", echo{Text: "nobody"}, &got); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Request nobody answers = %v, want a deadline", err)
	}
}

func TestCode(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]string{
		kv.ErrInvalid:                      CodeInvalid,
		fmt.Errorf("x: %w", kv.ErrChanged): CodeConflict,
		ErrNoResponders:                    CodeUnavailable,
		&Error{Code: CodeNotFound}:         CodeNotFound,
		context.Canceled:                   CodeInternal,
	} {
		if got := Code(err); got != want {
			t.Errorf("Code(%v) = %s, want %s", err, got, want)
		}
	}
}

// TestReplyTooLarge: a reply over the broker's message limit is not
// dropped: the requester gets a 500 saying so at once, not a time-out.
func TestReplyTooLarge(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	svc, err := AddService(env.NC, "gantry-test", "big", Endpoint{
		Name: "big", Subject: "test.big",
		Handler: func(req micro.Request) {
			_ = Respond(req, echo{Text: strings.Repeat("x", int(env.NC.MaxPayload()))}, nil)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var re *Error
	if err := Request(ctx, env.NC, "test.big", echo{}, nil); !errors.As(err, &re) || re.Code != CodeInternal || !strings.Contains(re.Description, "message limit") {
		t.Errorf("too large a reply = %v, want a 500 naming the message limit", err)
	}
}

// TestDetach: a detached request is answered after its handler returned,
// from another goroutine, with a reply or an error, as Respond answers.
func TestDetach(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	svc, err := AddService(env.NC, "gantry-test-later", "echo later", Endpoint{
		Name: "later", Subject: "test.later",
		Handler: func(req micro.Request) {
			req = Detach(env.NC, req)
			wg.Go(func() { answer(req) })
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 20 {
		var got echo
		if err := Request(ctx, env.NC, "test.later", echo{Text: "hi"}, &got); err != nil || got.Text != "hi" {
			t.Fatalf("Request = %+v, %v; want hi, nil", got, err)
		}
		if err := Request(ctx, env.NC, "test.later", echo{Fail: "not_found"}, nil); !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("Request(not_found) = %v, want kv.ErrNotFound", err)
		}
	}
}
