package broker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestProvisioned(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	var streams []string
	for name := range env.JS.StreamNames(ctx(t)).Name() {
		streams = append(streams, name)
	}
	for _, want := range []string{wire.StreamTasks, wire.StreamAudit} {
		if !slices.Contains(streams, want) {
			t.Errorf("streams = %v, want %s among them", streams, want)
		}
	}
	var buckets []string
	for name := range env.JS.KeyValueStoreNames(ctx(t)).Name() {
		buckets = append(buckets, name)
	}
	for _, want := range wire.Buckets {
		if !slices.Contains(buckets, want) {
			t.Errorf("buckets = %v, want %s among them", buckets, want)
		}
	}
	// A plain core-NATS publish on a task subject lands in the tasks stream.
	if err := env.NC.Publish(wire.TaskSubject("", "noop"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	s, err := env.JS.Stream(ctx(t), wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	check.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		info, err := s.Info(c)
		if err != nil {
			return err
		}
		if info.State.Msgs != 1 {
			return fmt.Errorf("tasks stream Msgs = %d, want 1", info.State.Msgs)
		}
		return nil
	})
}

func TestProvisionIdempotentAndUpdates(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	kv, err := env.JS.KeyValue(ctx(t), wire.BucketResources)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx(t), "cam1", []byte(`{"id":"cam1"}`)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := broker.Provision(ctx(t), env.NC, broker.ProvisionConfig{}); err != nil {
			t.Fatalf("Provision again: %v", err)
		}
	}
	if e, err := kv.Get(ctx(t), "cam1"); err != nil || string(e.Value()) != `{"id":"cam1"}` {
		t.Errorf("after re-provisioning, cam1 = %v, %v; want it kept", e, err)
	}
	if err := broker.Provision(ctx(t), env.NC, broker.ProvisionConfig{AuditMaxAge: time.Hour}); err != nil {
		t.Fatalf("Provision with a changed setting: %v", err)
	}
	s, err := env.JS.Stream(ctx(t), wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != time.Hour {
		t.Errorf("audit MaxAge = %v, want 1h after the update", got)
	}
}

// TestProvisionUpgradesTasksBucket provisions over a gantry_tasks bucket made
// as releases before per-key TTLs made it: the update turns TTLs on, keeps
// the records, and a record written with a TTL then expires.
func TestProvisionUpgradesTasksBucket(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	if err := env.JS.DeleteKeyValue(ctx(t), wire.BucketTasks); err != nil {
		t.Fatal(err)
	}
	old, err := env.JS.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{
		Bucket: wire.BucketTasks, Description: "task state by task id", History: 1, Storage: jetstream.FileStorage, Replicas: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx(t), "kept", []byte(`{"id":"kept","state":"SUCCEEDED"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx(t), "$KV."+wire.BucketTasks+".early", []byte(`{}`), jetstream.WithMsgTTL(time.Second)); err == nil {
		t.Fatal("a TTL put on the old bucket succeeded, want it refused (the test must start from a bucket without TTLs)")
	}

	if err := broker.Provision(ctx(t), env.NC, broker.ProvisionConfig{}); err != nil {
		t.Fatalf("Provision over the old bucket: %v", err)
	}
	s, err := env.JS.Stream(ctx(t), "KV_"+wire.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; !cfg.AllowMsgTTL || cfg.SubjectDeleteMarkerTTL != time.Minute {
		t.Errorf("after Provision, AllowMsgTTL = %v, SubjectDeleteMarkerTTL = %v; want true, 1m", cfg.AllowMsgTTL, cfg.SubjectDeleteMarkerTTL)
	}
	b, err := env.JS.KeyValue(ctx(t), wire.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := b.Get(ctx(t), "kept"); err != nil || e.Revision() != 1 {
		t.Errorf("after Provision, kept = %v, %v; want revision 1 kept", e, err)
	}
	if _, err := env.JS.Publish(ctx(t), "$KV."+wire.BucketTasks+".brief", []byte(`{}`), jetstream.WithMsgTTL(time.Second)); err != nil {
		t.Fatalf("TTL put after Provision: %v", err)
	}
	c := ctx(t)
	check.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if _, err := b.Get(c, "brief"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("Get(brief) error = %v after a 1s TTL put, want ErrKeyNotFound", err)
		}
		return nil
	})
	if _, err := b.Get(ctx(t), "kept"); err != nil {
		t.Errorf("kept after brief expired = %v, want it kept (it has no TTL)", err)
	}
}

func TestRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := start(t, dir)
	nc, js := brokertest.Connect(t, first.ClientURL())
	if _, err := js.Publish(ctx(t), wire.TaskSubject("q", "noop"), []byte(`{"id":"t1"}`)); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx(t), "tick", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	first.Shutdown()
	first.Shutdown() // idempotent

	second := start(t, dir)
	_, js = brokertest.Connect(t, second.ClientURL())
	s, err := js.Stream(ctx(t), wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(ctx(t), wire.TaskSubject("q", "noop"))
	if err != nil || string(msg.Data) != `{"id":"t1"}` {
		t.Errorf("task after restart = %v, %v; want it kept", msg, err)
	}
	kv, err = js.KeyValue(ctx(t), wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx(t), "tick"); err != nil || string(e.Value()) != "v1" {
		t.Errorf("job after restart = %v, %v; want v1", e, err)
	}
}

func start(t *testing.T, dir string) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{DataDir: dir, Listen: "127.0.0.1:0", Logger: brokertest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	return b
}

func TestRefusesInsecureListen(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:4222", "192.0.2.1:4222", ":4222"} {
		_, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: addr})
		if !errors.Is(err, broker.ErrInsecureListen) {
			t.Errorf("New(listen %s) error = %v, want ErrInsecureListen", addr, err)
		}
	}
	_, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "0.0.0.0:4222",
		Users: []broker.User{{Name: "ops", Password: "s3cret"}}})
	if err != nil {
		t.Errorf("New(0.0.0.0 with users) = %v, want nil", err)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		Users: []broker.User{{Name: "ops", Password: "s3cret"}}, Logger: brokertest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	if nc, err := nats.Connect(b.ClientURL()); err == nil {
		nc.Close()
		t.Error("anonymous connect succeeded, want an authorization error")
	}
	nc, err := nats.Connect(b.ClientURL(), nats.UserInfo("ops", "s3cret"))
	if err != nil {
		t.Fatalf("connect as ops: %v", err)
	}
	nc.Close()
	in, err := b.Connect("internal")
	if err != nil {
		t.Fatalf("in-process connect: %v", err)
	}
	defer in.Close()
	js, err := jetstream.New(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx(t), wire.StreamTasks); err != nil {
		t.Errorf("in-process JetStream: %v", err)
	}
}

func BenchmarkStartReady(b *testing.B) {
	for b.Loop() {
		br, err := broker.New(broker.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		if err := br.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		br.Shutdown()
	}
}
