package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/auditd"
	"github.com/gantry-dev/gantry/backup"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// connectClient connects a client to url for the test.
func connectClient(t testing.TB, url string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Options{Servers: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// handlerSet is a handler of a task type served from the test over
// gantry.handlers.<type>: it records the tasks it is asked to run, and
// answers (success) only if answer is set.
type handlerSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func serveHandler(t *testing.T, nc *nats.Conn, typ string, answer bool) *handlerSet {
	t.Helper()
	h := &handlerSet{ids: map[string]bool{}}
	sub, err := nc.Subscribe(wire.HandlerSubject(typ), func(m *nats.Msg) {
		var req wire.HandlerRequest
		if json.Unmarshal(m.Data, &req) != nil {
			return
		}
		h.mu.Lock()
		h.ids[req.ID] = true
		h.mu.Unlock()
		if answer {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *handlerSet) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for id := range h.ids {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// TestBackupUnderLoadAndRestore is the whole story: a system with tasks
// flowing through real workers, tasks held running and waiting, leases
// held and events written is backed up while it runs, the old machine dies,
// the backup (checked first; damaged copies are refused) is restored into a
// new data dir and gantry started there.
func TestBackupUnderLoadAndRestore(t *testing.T) {
	t.Parallel()
	site := okSite(t)
	cfg := writeConfig(t, fmt.Sprintf(`
routes:
  - {id: office, proxy: direct, probe_url: %q, interval: 1s}
resources:
  - {id: cam1, route: office}
  - {id: cam2}
  - {id: cam3, reclaim: fault}
jobs:
  - {name: tick, type: noop, every: 1h}
`, site.URL))
	common := []string{"--config", cfg, "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--ack-wait", "1s"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The old machine: the queue "held" runs 3 tasks at once, and its
	// handler takes them and never answers, so they stay RUNNING and the
	// rest WAITING behind them.
	oldData := t.TempDir()
	old, ready := startGantry(t, append([]string{"run", "--data", oldData, "--queue", "default", "--queue", "held=3"}, common...)...)
	url := ready.NATS
	c := connectClient(t, url)
	nc, js := brokertest.Connect(t, url)
	oldHandler := serveHandler(t, nc, "hold", false)

	// Leases: cam1 held by an operator, cam2 and cam3 by tasks that run.
	if code, _, stderr := leaseCLI(t, url, "lease", "acquire", "cam1", "--owner", "ops", "--ttl", "1h"); code != exitOK {
		t.Fatalf("lease acquire cam1 = exit %d, stderr %q", code, stderr)
	}
	held := []string{"hold-cam2", "hold-cam3", "hold-1", "hold-2", "hold-3", "hold-4", "hold-5"}
	for _, id := range held {
		task := client.Task{ID: id, Type: "hold", Queue: "held"}
		if res, ok := strings.CutPrefix(id, "hold-cam"); ok {
			task.Resource = "cam" + res
		}
		if _, err := c.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	poll.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if got := oldHandler.seen(); len(got) != 3 {
			return fmt.Errorf("held tasks running = %v, want 3", got)
		}
		return nil
	})

	// Events from a day ago, stored before the backup.
	markers := auditEvents(20, time.Now().Add(-24*time.Hour))
	publishEvents(t, js, markers)
	window := []string{"--since", markers[0].Time.Format(time.RFC3339Nano), "--until", markers[19].Time.Add(time.Millisecond).Format(time.RFC3339Nano)}
	markerQueries := [][]string{{"--resource", "cam1"}, {"--task", "task-2"}, {"--type", "task_finished"}}
	before := map[string][]string{}
	for _, q := range markerQueries {
		page := waitQuery(t, url, map[string]int{"--resource": 10, "--task": 6, "--type": 5}[q[0]], append(q, window...)...)
		before[strings.Join(q, " ")] = ids(page.Events)
	}

	// Load: noop tasks flow through the default queue while the backup
	// is taken.
	stop := make(chan struct{})
	submitted := make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				submitted <- n
				return
			default:
			}
			if _, err := c.Submit(ctx, client.Task{Type: "noop", Payload: client.NoopPayload{Sleep: "20ms"}}); err == nil {
				n++
			}
		}
	}()
	poll.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		done, err := c.Tasks(ctx, client.TaskFilter{Type: "noop", State: client.TaskSucceeded})
		if err != nil || len(done) < 20 {
			return fmt.Errorf("noop tasks done = %d (err %v), want 20 before the backup", len(done), err)
		}
		return nil
	})

	backupDir := filepath.Join(t.TempDir(), "backup")
	code, stdout, stderr := runInProcess(t, "backup", backupDir, "--server", url, "--json")
	close(stop)
	n := <-submitted
	if code != exitOK {
		t.Fatalf("gantry backup = exit %d, stderr %q", code, stderr)
	}
	var m wire.BackupManifest
	if err := json.Unmarshal([]byte(stdout), &m); err != nil {
		t.Fatalf("backup --json printed %q: %v", stdout, err)
	}
	if want := len(wire.Buckets) + 1; m.Audit == nil || len(m.Streams) != want {
		t.Fatalf("manifest = %d streams, audit %v; want %d (every bucket but gantry_waiters, the task and audit streams) and the audit store", len(m.Streams), m.Audit, want)
	}
	t.Logf("backed up while %d noop tasks were submitted: %d files", n, len(m.Files))

	// The old machine dies.
	_ = old.Process.Kill()
	_ = old.Wait()

	t.Run("damaged backup refused", func(t *testing.T) {
		for _, tc := range []struct {
			name, file string
			damage     func(path string) error
			want       string
		}{
			{"corrupted", "streams/GANTRY_TASKS/stream.arc.s2", func(path string) error {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				b[len(b)/2] ^= 0x01
				return os.WriteFile(path, b, 0o640)
			}, "SHA-256 does not match"},
			{"truncated", "streams/KV_gantry_leases/stream.arc.s2", func(path string) error {
				info, err := os.Stat(path)
				if err != nil {
					return err
				}
				return os.Truncate(path, info.Size()/2)
			}, "truncated"},
		} {
			dir := filepath.Join(t.TempDir(), "copy")
			if err := os.CopyFS(dir, os.DirFS(backupDir)); err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(filepath.Join(dir, filepath.FromSlash(tc.file))); err != nil {
				t.Fatal(err)
			}
			want := tc.file + ": " + tc.want
			if code, _, stderr := runInProcess(t, "backup", "verify", dir); code != exitUsage || !strings.Contains(stderr, want) {
				t.Errorf("%s: backup verify = exit %d, stderr %q; want exit 2 saying %q", tc.name, code, stderr, want)
			}
			newData := filepath.Join(t.TempDir(), "data")
			if code, _, stderr := runInProcess(t, "restore", dir, "--data", newData); code != exitUsage || !strings.Contains(stderr, want) {
				t.Errorf("%s: restore = exit %d, stderr %q; want exit 2 saying %q", tc.name, code, stderr, want)
			}
			if _, err := os.Stat(newData); !os.IsNotExist(err) {
				t.Errorf("%s: data dir after a refused restore: %v, want none created", tc.name, err)
			}
		}
	})

	if code, stdout, stderr := runInProcess(t, "backup", "verify", backupDir); code != exitOK || !strings.Contains(stdout, "is whole") {
		t.Fatalf("backup verify = exit %d, stdout %q, stderr %q; want exit 0", code, stdout, stderr)
	}
	if code, _, stderr := runInProcess(t, "restore", backupDir, "--data", oldData); code != exitUsage || !strings.Contains(stderr, "not empty") {
		t.Errorf("restore over the old data dir = exit %d, stderr %q; want exit 2 refusing a data dir that is not empty", code, stderr)
	}
	newData := filepath.Join(t.TempDir(), "data")
	code, stdout, stderr = runInProcess(t, "restore", backupDir, "--data", newData, "--json")
	if code != exitOK {
		t.Fatalf("restore = exit %d, stderr %q", code, stderr)
	}
	var restored backup.Restored
	if err := json.Unmarshal([]byte(stdout), &restored); err != nil {
		t.Fatalf("restore --json printed %q: %v", stdout, err)
	}
	var revoked []string
	for _, l := range restored.LeasesRevoked {
		revoked = append(revoked, l.Resource)
	}
	slices.Sort(revoked)
	if want := []string{"cam1", "cam2", "cam3"}; !slices.Equal(revoked, want) {
		t.Errorf("leases revoked = %v, want %v", revoked, want)
	}

	// The new machine: gantry run, then the held queue's worker once its
	// handler (which now answers) is there.
	_, ready = startGantry(t, append([]string{"run", "--data", newData, "--queue", "default"}, common...)...)
	url2 := ready.NATS
	c2 := connectClient(t, url2)
	nc2, _ := brokertest.Connect(t, url2)
	newHandler := serveHandler(t, nc2, "hold", true)
	startGantry(t, "worker", "--server", url2, "--queue", "held=3", "--ack-wait", "1s", "--delay", "1s")

	// Every task of the backup that had not finished runs: the held ones
	// that ran and waited, and the noop tasks the backup caught in flight.
	// hold-cam3 waits: its resource, RUNNING under a lease that is not
	// honoured, went to FAULT by its reclaim policy, until an operator
	// enables it.
	poll.For(t, 60*time.Second, 100*time.Millisecond, func() error {
		for _, id := range held {
			rec, err := c2.Task(ctx, id)
			if id != "hold-cam3" && (err != nil || rec.State != client.TaskSucceeded) {
				return fmt.Errorf("task %s = %s (err %v), want SUCCEEDED", id, rec.State, err)
			}
		}
		return nil
	})
	poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		if rec, err := c2.Task(ctx, "hold-cam3"); err != nil || rec.State.Terminal() || !strings.Contains(rec.LastError, "FAULT") {
			return fmt.Errorf("task hold-cam3 = %s, last error %q (err %v); want it waiting for cam3, which is FAULT", rec.State, rec.LastError, err)
		}
		return nil
	})
	for id, want := range map[string]wire.ResourceState{"cam1": wire.ResourceAvailable, "cam3": wire.ResourceFault} {
		res, err := c2.Resource(ctx, id)
		if err != nil || res.State != want {
			t.Errorf("resource %s after restore = %s (err %v), want %s", id, res.State, err, want)
		}
	}
	if code, _, stderr := leaseCLI(t, url2, "resource", "enable", "cam3"); code != exitOK {
		t.Fatalf("resource enable cam3 = exit %d, stderr %q", code, stderr)
	}
	poll.For(t, 60*time.Second, 100*time.Millisecond, func() error {
		live, err := c2.Tasks(ctx, client.TaskFilter{})
		if err != nil {
			return err
		}
		for _, rec := range live {
			if rec.State != client.TaskSucceeded && !slices.Contains(restored.TasksParked, rec.ID) {
				return fmt.Errorf("task %s (%s) = %s (%s), want it run to success", rec.ID, rec.Type, rec.State, rec.LastError)
			}
		}
		return nil
	})
	// The restore completed the records of the tasks that ended between
	// the snapshots of the records and of the task stream from their
	// TASK_FINISHED events, and parked only tasks whose message was
	// published after the stream's snapshot.
	for _, id := range restored.TasksParked {
		if rec, err := c2.Task(ctx, id); err != nil || !strings.Contains(rec.LastError, "not in the backup") {
			t.Errorf("parked task %s: last error %q (err %v), want it parked for a message not in the backup", id, rec.LastError, err)
		}
	}
	t.Logf("restore: %d task records completed from their end, %d tasks parked", len(restored.TasksCompleted), len(restored.TasksParked))
	if got := newHandler.seen(); !slices.Equal(got, sorted(held)) {
		t.Errorf("held tasks run on the new machine = %v, want %v", got, sorted(held))
	}

	// Jobs, resources and routes are there; no lease from before is
	// honoured: each was revoked with an event, and cam1 can be taken.
	if _, err := c2.Job(ctx, "tick"); err != nil {
		t.Errorf("job tick after restore: %v", err)
	}
	routes, err := c2.Routes(ctx)
	if err != nil || len(routes) != 1 || routes[0].ID != "office" {
		t.Errorf("routes after restore = %+v (err %v), want office", routes, err)
	}
	page := waitQuery(t, url2, 3, "--type", "lease_revoked")
	var events []string
	for _, ev := range page.Events {
		events = append(events, ev.ResourceID)
	}
	slices.Sort(events)
	if want := []string{"cam1", "cam2", "cam3"}; !slices.Equal(events, want) {
		t.Errorf("LEASE_REVOKED events = %v, want one for each of %v", events, want)
	}
	if code, _, stderr := leaseCLI(t, url2, "lease", "acquire", "cam1", "--owner", "newcomer"); code != exitOK {
		t.Errorf("lease acquire cam1 by another owner after restore = exit %d, stderr %q; want the old lease not honoured", code, stderr)
	}

	// The audit store answers as it did: the same events for the same
	// queries, and every event of the backup's checkpoint.
	for _, q := range markerQueries {
		key := strings.Join(q, " ")
		if got := ids(waitQuery(t, url2, len(before[key]), append(q, window...)...).Events); !slices.Equal(got, before[key]) {
			t.Errorf("audit query %s after restore = %v, want %v", key, got, before[key])
		}
	}
	snapshot := checkpointEvents(t, filepath.Join(backupDir, "audit"), m.Audit.Time)
	after := map[string]bool{}
	q := client.AuditQuery{Until: &m.Audit.Time, Limit: 10000}
	for {
		page, err := c2.QueryAudit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			after[ev.ID] = true
		}
		if page.Cursor == "" {
			break
		}
		q.Cursor = page.Cursor
	}
	missing := 0
	for _, id := range snapshot {
		if !after[id] {
			missing++
		}
	}
	if missing > 0 || len(snapshot) < len(markers) {
		t.Errorf("audit store after restore lacks %d of the %d events of the backup's checkpoint, want all (and at least the %d markers)", missing, len(snapshot), len(markers))
	}
}

// checkpointEvents opens a copy of the audit store checkpoint in dir and
// returns the ids of its events before until.
func checkpointEvents(t *testing.T, dir string, until time.Time) []string {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "audit")
	if err := os.CopyFS(cp, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	store, err := auditd.OpenStore(cp, auditd.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var out []string
	q := wire.AuditQuery{Until: &until, Limit: 10000}
	for {
		page, err := store.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ids(page.Events)...)
		if page.Cursor == "" {
			return out
		}
		q.Cursor = page.Cursor
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestBackupJobKeepsTwo runs a job of the built-in type backup with keep 2
// three times: two backups remain, each whole.
func TestBackupJobKeepsTwo(t *testing.T) {
	t.Parallel()
	_, ready := startGantry(t, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := ready.NATS
	dir := t.TempDir()
	payload := fmt.Sprintf(`{"dir": %q, "keep": 2}`, dir)
	if code, _, stderr := jobCLI(t, url, "job", "add", "nightly", "--type", "backup", "--payload", payload, "--cron", "0 3 * * *"); code != exitOK {
		t.Fatalf("job add = exit %d, stderr %q", code, stderr)
	}
	backups := func() []string {
		entries, _ := os.ReadDir(dir)
		var out []string
		for _, e := range entries {
			if _, err := os.Stat(filepath.Join(dir, e.Name(), wire.BackupManifestFile)); err == nil {
				out = append(out, e.Name())
			}
		}
		return out
	}
	var taken []string
	for i := range 3 {
		// The first trigger waits for a scheduler to lead.
		poll.For(t, 20*time.Second, 100*time.Millisecond, func() error {
			if code, _, stderr := jobCLI(t, url, "job", "trigger", "nightly"); code != exitOK {
				return fmt.Errorf("job trigger %d = exit %d, stderr %q", i+1, code, stderr)
			}
			return nil
		})
		poll.For(t, 30*time.Second, 50*time.Millisecond, func() error {
			got := backups()
			if len(got) == 0 || slices.Contains(taken, got[len(got)-1]) {
				return fmt.Errorf("backups after trigger %d = %v, want a new one", i+1, got)
			}
			taken = append(taken, got[len(got)-1])
			return nil
		})
	}
	poll.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		if got := backups(); !slices.Equal(got, taken[1:]) {
			return fmt.Errorf("backups kept = %v, want the newest two %v", got, taken[1:])
		}
		return nil
	})
	for _, name := range taken[1:] {
		if code, _, stderr := runInProcess(t, "backup", "verify", filepath.Join(dir, name)); code != exitOK {
			t.Errorf("backup verify %s = exit %d, stderr %q", name, code, stderr)
		}
	}
}

func TestBackupCommandErrors(t *testing.T) {
	t.Parallel()
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env := brokertest.Start(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"non-empty dir", []string{"backup", full, "--server", env.URL}, exitUsage, "is not empty"},
		{"no auditd", []string{"backup", filepath.Join(t.TempDir(), "b"), "--server", env.URL}, exitFailure, "--no-audit"},
		{"verify not a backup", []string{"backup", "verify", full}, exitUsage, "gantry-backup.json: missing"},
		{"restore without --data", []string{"restore", full}, exitUsage, "--data NEWDIR is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runInProcess(t, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Errorf("gantry %v = exit %d, stderr %q; want exit %d saying %q", tc.args, code, stderr, tc.code, tc.want)
			}
		})
	}
}
