package workers

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

// startPipeline runs a pipeline on a connection of its own until the test
// ends; failures go to the returned channel.
func startPipeline(t *testing.T, env *brokertest.Env, timeout time.Duration) (*pipeline, <-chan error) {
	t.Helper()
	nc, _ := brokertest.Connect(t, env.URL)
	failed := make(chan error, 16)
	p := newPipeline(nc, timeout, 4, func(pb *pub, err error) { failed <- err })
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		p.run(stop, time.Second)
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return p, failed
}

func outcome(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome within 10s")
		return nil
	}
}

func TestPipelineOutcomes(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	p, failed := startPipeline(t, env, 300*time.Millisecond)

	// Stored: a positive acknowledgement, more publishes than max.
	for i := range 10 {
		done := make(chan error, 1)
		if err := p.publish(&nats.Msg{Subject: wire.SubjectAuditPrefix + ".test.stored", Data: []byte("{}")}, "", done); err != nil {
			t.Fatal(err)
		}
		if err := outcome(t, done); err != nil {
			t.Errorf("publish %d into the audit stream = %v, want nil", i, err)
		}
	}
	// No stream on the subject: no responders.
	done := make(chan error, 1)
	if err := p.publish(&nats.Msg{Subject: "nostream.x", Data: []byte("{}")}, "", done); err != nil {
		t.Fatal(err)
	}
	if err := outcome(t, done); err == nil {
		t.Error("publish without a stream = nil, want an error")
	}
	// A subscriber that never answers: not acknowledged, reported to failed.
	sub, err := env.NC.SubscribeSync("silent.x")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := p.publish(&nats.Msg{Subject: "silent.x", Data: []byte("{}")}, "01JEVENT", nil); err != nil {
		t.Fatal(err)
	}
	if err := outcome(t, failed); !errors.Is(err, errNotAcknowledged) {
		t.Errorf("failure of an unanswered publish = %v, want errNotAcknowledged", err)
	}
}

func TestAckError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		data string
		code int
		ok   bool
	}{
		{`{"stream":"GANTRY_AUDIT","seq":12}`, 0, true},
		{`{"stream":"error","seq":1,"duplicate":true}`, 0, true},
		{`{"stream":"KV_gantry_tasks","error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, 503, false},
		{`{"error":`, 0, false},
	} {
		err := ackError(&nats.Msg{Data: []byte(tc.data)})
		if (err == nil) != tc.ok {
			t.Errorf("ackError(%s) = %v, want ok %v", tc.data, err, tc.ok)
		}
		var apiErr *jetstream.APIError
		if tc.code != 0 && (!errors.As(err, &apiErr) || apiErr.Code != tc.code) {
			t.Errorf("ackError(%s) = %v, want an APIError with code %d", tc.data, err, tc.code)
		}
	}
}

func TestPipelineClosed(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	p := newPipeline(env.NC, time.Second, 4, func(*pub, error) {})
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	close(stop)
	p.run(stop, time.Second)
	if err := p.publish(&nats.Msg{Subject: wire.SubjectAuditPrefix + ".test.late"}, "", nil); !errors.Is(err, errPipelineClosed) {
		t.Errorf("publish after stop = %v, want errPipelineClosed", err)
	}
}
