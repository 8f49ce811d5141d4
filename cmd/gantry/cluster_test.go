package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// cluster is three 'gantry broker' processes forming one JetStream cluster.
type cluster struct {
	args  [][]string
	procs []*proc
	urls  []string
}

// startBrokers starts three brokers as separate processes, all at once,
// and waits until each is ready.
func startBrokers(t *testing.T) *cluster {
	t.Helper()
	ports := brokertest.FreePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, "nats-route://"+addr(ports[3+i]))
	}
	c := &cluster{}
	for i := range 3 {
		c.urls = append(c.urls, "nats://"+addr(ports[i]))
		c.args = append(c.args, []string{"broker", "--name", fmt.Sprintf("n%d", i), "--data", t.TempDir(),
			"--nats-listen", addr(ports[i]), "--http-listen", "",
			"--cluster", addr(ports[3+i]), "--routes", strings.Join(routes, ",")})
		c.procs = append(c.procs, spawn(t, fmt.Sprintf("n%d", i), c.args[i]...))
	}
	for _, p := range c.procs {
		p.waitReady(t, 60*time.Second)
	}
	return c
}

// restart starts member i again on its data dir and ports.
func (c *cluster) restart(t *testing.T, i int) {
	t.Helper()
	c.procs[i] = spawn(t, fmt.Sprintf("n%d'", i), c.args[i]...)
	c.procs[i].waitReady(t, 60*time.Second)
}

func (c *cluster) servers() string { return strings.Join(c.urls, ",") }

// TestClusterFailover is the cluster's acceptance test: three brokers, a
// worker, a scheduler and an auditd, each its own process. One broker is
// killed (SIGKILL) while tasks are submitted and run: no acknowledged task
// is lost, each operation key runs once, every task finishes, the audit
// store holds every event of the stream, and the killed broker rejoins and
// catches up.
// failoverSize is how many tasks TestClusterFailover submits:
// GANTRY_FAILOVER_N for a longer run than the default 1,500.
func failoverSize(t *testing.T) int {
	t.Helper()
	v := os.Getenv("GANTRY_FAILOVER_N")
	if v == "" {
		return 1500
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 30 {
		t.Fatalf("GANTRY_FAILOVER_N = %q, want a number ≥ 30", v)
	}
	return n
}

func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-broker cluster under load takes about a minute")
	}
	n := failoverSize(t)
	c := startBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), max(3*time.Minute, time.Duration(n)*120*time.Millisecond))
	defer cancel()
	cl, err := client.Connect(ctx, client.Options{Servers: c.servers()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	js, err := jetstream.New(cl.Conn())
	if err != nil {
		t.Fatal(err)
	}

	// Every stream and bucket is R3.
	names := []string{wire.StreamTasks, wire.StreamAudit}
	for _, b := range wire.Buckets {
		names = append(names, "KV_"+b)
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.Replicas; got != 3 {
			t.Errorf("%s replicas = %d, want 3", name, got)
		}
	}

	cfg := filepath.Join(t.TempDir(), "gantry.yaml")
	if err := os.WriteFile(cfg, []byte("jobs:\n  - {name: tick, type: noop, every: 1s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	worker := spawn(t, "worker", "--server", c.servers(), "--log-level", "debug", "worker", "--concurrency", "32", "--ack-wait", "10s")
	sched := spawn(t, "scheduler", "--server", c.servers(), "scheduler", "--config", cfg)
	auditor := spawn(t, "auditd", "--server", c.servers(), "auditd", "--data", t.TempDir())
	for _, p := range []*proc{worker, sched, auditor} {
		p.waitReady(t, 30*time.Second)
	}

	// Submit tasks with operation keys from 8 clients; kill the leader of
	// the tasks stream a third of the way through.
	out := t.TempDir()
	var (
		submitted sync.Map // key -> task id, once acknowledged
		next      atomic.Int64
		wg        sync.WaitGroup
		killed    = make(chan int, 1)
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if i == n/3 {
					killed <- c.killStreamLeader(t, js)
				}
				key := fmt.Sprintf("op-%d", i)
				task := client.Task{Type: "exec", Key: key, Payload: client.ExecPayload{
					Cmd: []string{"sh", "-c", "echo \"$GANTRY_TASK_ID attempt $GANTRY_ATTEMPT\" >> " + filepath.Join(out, key)}}}
				// The submit retries while the stream leader moves.
				err := poll.Until(time.Minute, 100*time.Millisecond, func() error {
					sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
					defer scancel()
					sub, err := cl.Submit(sctx, task)
					if err == nil {
						submitted.Store(key, sub.ID)
					}
					return err
				})
				if err != nil {
					t.Errorf("submit %s: %v", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	victim := <-killed

	// Every acknowledged task finishes SUCCEEDED. (If not, the worker's
	// goroutines are dumped into the log: SIGQUIT.)
	t.Cleanup(func() {
		if t.Failed() && worker.cmd.ProcessState == nil {
			_ = worker.cmd.Process.Signal(syscall.SIGQUIT)
			<-worker.done
		}
	})
	poll.For(t, max(90*time.Second, time.Duration(n)*60*time.Millisecond), 50*time.Millisecond, func() error {
		recs, err := cl.Tasks(ctx, client.TaskFilter{Type: "exec"})
		if err != nil {
			return err
		}
		done := 0
		var others []string
		for _, r := range recs {
			if r.State == client.TaskSucceeded {
				done++
			} else if len(others) < 5 {
				others = append(others, fmt.Sprintf("%s %s attempts %d deliveries %d seq %d (%s): %s", r.ID, r.State, r.Attempts, r.Deliveries, r.Seq,
					inStream(ctx, js, r.Seq), r.LastError))
			}
		}
		if done < n {
			return fmt.Errorf("%d of %d tasks succeeded (%d records); others: %s", done, n, len(recs), strings.Join(others, "; "))
		}
		return nil
	})
	submitted.Range(func(k, id any) bool {
		rec, err := cl.Task(ctx, id.(string))
		if err != nil || rec.State != client.TaskSucceeded {
			t.Errorf("task %s (%s) = %v, %v; want SUCCEEDED", id, k, rec.State, err)
		}
		return true
	})
	// Each operation key ran once.
	for i := range n {
		data, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("op-%d", i)))
		if lines := strings.Count(string(data), "\n"); err != nil || lines != 1 {
			t.Errorf("op-%d ran %d times (%q, %v), want once", i, lines, data, err)
		}
	}

	// The killed broker rejoins and catches up.
	c.restart(t, victim)
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, name := range names {
			s, err := js.Stream(ctx, name)
			if err != nil {
				return err
			}
			info := s.CachedInfo()
			if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				return fmt.Errorf("%s: no cluster info with two followers", name)
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current || r.Lag != 0 {
					return fmt.Errorf("%s: replica %s current %v lag %d", name, r.Name, r.Current, r.Lag)
				}
			}
		}
		return nil
	})

	// The audit store holds each event of the stream, once.
	sched.stop(t)
	worker.stop(t)
	produced := streamEventIDs(t, ctx, js)
	poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
		stored, err := storedEventIDs(ctx, cl)
		if err != nil {
			return err
		}
		if len(stored) != len(produced) {
			return fmt.Errorf("audit store holds %d events, the stream %d", len(stored), len(produced))
		}
		for id := range produced {
			if !stored[id] {
				return fmt.Errorf("event %s is not in the audit store", id)
			}
		}
		return nil
	})
	finished, err := cl.QueryAudit(ctx, client.AuditQuery{Type: wire.EventTaskFinished, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	perTask := map[string]int{}
	for _, ev := range finished.Events {
		perTask[ev.TaskID]++
	}
	submitted.Range(func(_, id any) bool {
		if perTask[id.(string)] != 1 {
			t.Errorf("task %s has %d TASK_FINISHED events, want 1", id, perTask[id.(string)])
		}
		return true
	})
	auditor.stop(t)
}

// inStream says whether the tasks stream holds seq, and what the queue's
// consumer has delivered, for a failure message.
func inStream(ctx context.Context, js jetstream.JetStream, seq uint64) string {
	s, err := js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return err.Error()
	}
	_, err = s.GetMsg(ctx, seq)
	held := "in the stream"
	if err != nil {
		held = "not in the stream: " + err.Error()
	}
	for info := range s.ListConsumers(ctx).Info() {
		held += fmt.Sprintf("; consumer %s delivered %d ack floor %d pending %d ack pending %d redelivered %d",
			info.Name, info.Delivered.Stream, info.AckFloor.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered)
	}
	return held
}

// killStreamLeader SIGKILLs the broker leading the tasks stream and
// returns its index.
func (c *cluster) killStreamLeader(t *testing.T, js jetstream.JetStream) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	victim := 1
	if s, err := js.Stream(ctx, wire.StreamTasks); err == nil && s.CachedInfo().Cluster != nil {
		fmt.Sscanf(s.CachedInfo().Cluster.Leader, "n%d", &victim)
	}
	t.Logf("killing n%d, the tasks stream's leader", victim)
	c.procs[victim].kill()
	return victim
}

// streamEventIDs reads the ids of every event in GANTRY_AUDIT.
func streamEventIDs(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for id := range streamEventCounts(t, ctx, js) {
		ids[id] = true
	}
	return ids
}

// streamEventCounts counts the messages of each event id in GANTRY_AUDIT.
func streamEventCounts(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]int {
	t.Helper()
	s, err := js.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for got := uint64(0); got < info.State.Msgs; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			got++
			var ev struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatalf("audit message %q: %v", m.Data(), err)
			}
			ids[ev.ID]++
		}
		if batch.Error() != nil {
			t.Fatal(batch.Error())
		}
	}
	return ids
}

// storedEventIDs pages through every event of the audit store.
func storedEventIDs(ctx context.Context, cl *client.Client) (map[string]bool, error) {
	ids := map[string]bool{}
	q := client.AuditQuery{Limit: 1000}
	for {
		page, err := cl.QueryAudit(ctx, q)
		if err != nil {
			return nil, err
		}
		for _, ev := range page.Events {
			ids[ev.ID] = true
		}
		if page.Cursor == "" || len(page.Events) == 0 {
			return ids, nil
		}
		q.Cursor = page.Cursor
	}
}

// TestClusterFromConfig forms the cluster of startBrokers from the config
// files' broker section alone (name, cluster, cluster_name, routes): every
// stream and bucket gets three replicas on the three named members of the
// named cluster. A member started again with --replicas 1, its file saying
// replicas: 3, lowers them to one: an explicit flag wins over the file.
func TestClusterFromConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of three brokers takes a few seconds to form")
	}
	ports := brokertest.FreePorts(t, 6)
	var routes, urls []string
	for i := range 3 {
		routes = append(routes, "nats-route://"+addr(ports[3+i]))
		urls = append(urls, "nats://"+addr(ports[i]))
	}
	files, args := make([]string, 3), make([][]string, 3)
	procs := make([]*proc, 3)
	writeConfig := func(i int, extra string) {
		t.Helper()
		doc := fmt.Sprintf("broker:\n  name: cfg%d\n  cluster: %s\n  cluster_name: plant\n  routes: [%s]\n%s",
			i, addr(ports[3+i]), strings.Join(routes, ", "), extra)
		if err := os.WriteFile(files[i], []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		files[i] = filepath.Join(t.TempDir(), "broker.yaml")
		writeConfig(i, "")
		args[i] = []string{"broker", "--config", files[i], "--data", t.TempDir(), "--nats-listen", addr(ports[i]), "--http-listen", ""}
		procs[i] = spawn(t, fmt.Sprintf("cfg%d", i), args[i]...)
	}
	for _, p := range procs {
		p.waitReady(t, 60*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, js := brokertest.Connect(t, strings.Join(urls, ","))
	names := []string{wire.StreamTasks, wire.StreamAudit}
	for _, b := range wire.Buckets {
		names = append(names, "KV_"+b)
	}
	// replicas waits until every stream and bucket has want replicas,
	// current, on members of the cluster plant named in the files.
	replicas := func(want int) {
		t.Helper()
		poll.For(t, time.Minute, 100*time.Millisecond, func() error {
			for _, name := range names {
				s, err := js.Stream(ctx, name)
				if err != nil {
					return err
				}
				info := s.CachedInfo()
				if info.Config.Replicas != want || info.Cluster == nil {
					return fmt.Errorf("%s replicas = %d, want %d", name, info.Config.Replicas, want)
				}
				if info.Cluster.Name != "plant" {
					return fmt.Errorf("%s cluster = %q, want plant", name, info.Cluster.Name)
				}
				peers := []string{info.Cluster.Leader}
				for _, p := range info.Cluster.Replicas {
					if !p.Current {
						return fmt.Errorf("%s replica %s not current", name, p.Name)
					}
					peers = append(peers, p.Name)
				}
				if len(peers) != want {
					return fmt.Errorf("%s peers = %v, want %d", name, peers, want)
				}
				for _, p := range peers {
					if !strings.HasPrefix(p, "cfg") {
						return fmt.Errorf("%s peer %q, want one of the names in the files (cfg0..cfg2)", name, p)
					}
				}
			}
			return nil
		})
	}
	replicas(3)
	// Every member follows the same meta leader, a member of plant.
	poll.For(t, time.Minute, 100*time.Millisecond, func() error {
		leaders := map[string]bool{}
		for i, p := range procs {
			l, err := metaLeader(p, fmt.Sprintf("cfg%d/plant", i))
			if err != nil {
				return err
			}
			leaders[l] = true
		}
		if len(leaders) != 1 || !leaders["cfg0/plant"] && !leaders["cfg1/plant"] && !leaders["cfg2/plant"] {
			return fmt.Errorf("meta leaders = %v, want one, a member of plant", leaders)
		}
		return nil
	})

	procs[2].stop(t)
	writeConfig(2, "  replicas: 3\n")
	procs[2] = spawn(t, "cfg2'", append(args[2], "--replicas", "1")...)
	procs[2].waitReady(t, 60*time.Second)
	replicas(1)
}

// metaLeader returns the JetStream meta leader (server/cluster) that the
// last such line of p's log names, p being the member self (server/cluster).
func metaLeader(p *proc, self string) (string, error) {
	lines := p.logged("metadata leader")
	if len(lines) == 0 {
		return "", fmt.Errorf("%s logged no meta leader", self)
	}
	var l logLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &l); err != nil {
		return "", err
	}
	if strings.HasPrefix(l.Msg, "Self is new") {
		return self, nil
	}
	if _, leader, ok := strings.Cut(l.Msg, "new metadata leader: "); ok {
		return leader, nil
	}
	return "", fmt.Errorf("%s: %q, want a meta leader", self, l.Msg)
}
