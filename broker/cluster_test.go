package broker_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/tasks"
)

// startCluster starts n brokers that form one cluster, all at once, as
// a cluster's members start, each provisioning.
func startCluster(t *testing.T, n int) []*broker.Broker {
	t.Helper()
	ports := brokertest.FreePorts(t, n)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	bs := make([]*broker.Broker, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		b, err := broker.New(broker.Config{
			DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: fmt.Sprintf("n%d", i),
			Cluster: &broker.Cluster{Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Routes: routes},
			Logger:  brokertest.Logger(t).With("server", i),
		})
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
		t.Cleanup(b.Shutdown)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.Start(ctx(t))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start broker %d: %v", i, err)
		}
	}
	return bs
}

func TestClusterR3(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a cluster of three takes a few seconds to form")
	}
	bs := startCluster(t, 3)
	_, js := brokertest.Connect(t, bs[0].ClientURL()+","+bs[1].ClientURL()+","+bs[2].ClientURL())
	names := []string{wire.StreamTasks, wire.StreamAudit}
	for _, b := range wire.Buckets {
		names = append(names, "KV_"+b)
	}
	for _, name := range names {
		s, err := js.Stream(ctx(t), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if got := s.CachedInfo().Config.Replicas; got != 3 {
			t.Errorf("%s replicas = %d, want 3", name, got)
		}
	}

	// A compare-and-swap conflict on a replicated bucket is a conflict,
	// whichever of the two codes the server answers.
	store, err := tasks.NewStore(ctx(t), js, tasks.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rec := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: "t1", Type: "noop", Queue: "default", State: wire.TaskWaiting}}
	rev, err := store.Create(ctx(t), rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Update(ctx(t), rec, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Update(ctx(t), rec, rev); !errors.Is(err, tasks.ErrChanged) {
		t.Errorf("stale update on R3 = %v, want tasks.ErrChanged", err)
	}
}

// TestClusterGrows starts a cluster of two, whose streams are R1, then
// adds a third member: every stream and bucket is raised to R3 in place,
// keeping its messages.
func TestClusterGrows(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a cluster of three takes a few seconds to form")
	}
	ports := brokertest.FreePorts(t, 3)
	route := func(i int) string { return fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i]) }
	start := func(i int, routes ...string) *broker.Broker {
		b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: fmt.Sprintf("g%d", i),
			Cluster: &broker.Cluster{Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Routes: routes},
			Logger:  brokertest.Logger(t).With("server", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Shutdown)
		return b
	}
	two := []*broker.Broker{start(0, route(0), route(1)), start(1, route(0), route(1))}
	errs := make(chan error, 2)
	for _, b := range two {
		go func() { errs <- b.Start(ctx(t)) }()
	}
	for range two {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	_, js := brokertest.Connect(t, two[0].ClientURL())
	if _, err := js.Publish(ctx(t), wire.TaskSubject("", "noop"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Replicas; got != 1 {
		t.Errorf("tasks stream replicas in a cluster of two = %d, want 1", got)
	}

	third := start(2, route(0), route(1), route(2))
	if err := third.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	names := []string{wire.StreamTasks, wire.StreamAudit}
	for _, b := range wire.Buckets {
		names = append(names, "KV_"+b)
	}
	check.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, name := range names {
			s, err := js.Stream(ctx(t), name)
			if err != nil {
				return err
			}
			info, err := s.Info(ctx(t))
			if err != nil {
				return err
			}
			if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				return fmt.Errorf("%s replicas = %d, want 3 with two followers", name, info.Config.Replicas)
			}
			for _, p := range info.Cluster.Replicas {
				if !p.Current {
					return fmt.Errorf("%s replica %s not current", name, p.Name)
				}
			}
			if name == wire.StreamTasks && info.State.Msgs != 1 {
				return fmt.Errorf("tasks stream holds %d messages, want 1", info.State.Msgs)
			}
		}
		return nil
	})
}

// TestClusterRefusesStandaloneData starts a cluster member on the data
// dir of a standalone broker: refused, rather than losing its streams.
func TestClusterRefusesStandaloneData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	solo := start(t, dir)
	solo.Shutdown()
	ports := brokertest.FreePorts(t, 2)
	b, err := broker.New(broker.Config{DataDir: dir, Listen: "127.0.0.1:0",
		Cluster: &broker.Cluster{Listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), Routes: []string{fmt.Sprintf("nats-route://127.0.0.1:%d", ports[1])}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	if err := b.Start(ctx(t)); !errors.Is(err, broker.ErrStandaloneData) {
		t.Errorf("cluster start on a standalone data dir = %v, want ErrStandaloneData", err)
	}
}
