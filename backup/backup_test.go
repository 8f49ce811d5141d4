package backup

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/tasks"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// publishTask publishes a task with id on the default queue and returns
// its stream sequence.
func publishTask(t *testing.T, env *brokertest.Env, id string) uint64 {
	t.Helper()
	msg, err := tasks.NewMsg("", "noop", wire.Task{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := env.JS.PublishMsg(testCtx(t), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// system is what TestTakeAndRestore sets up on the source broker.
type system struct {
	env   *brokertest.Env
	tasks *tasks.Store
}

// setupSystem fills a broker with what a running gantry holds: resources
// held under leases, tasks waiting and delivered, task records, a job.
func setupSystem(t *testing.T) *system {
	t.Helper()
	env := brokertest.Start(t)
	ctx := testCtx(t)
	res, err := lease.NewResources(env.JS, lease.ResourcesConfig{Audit: audit.NewEmitter(env.JS, "test", nil), Logger: env.Log})
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []lease.ResourceSpec{{ID: "cam1"}, {ID: "cam2"}, {ID: "cam3", Reclaim: lease.ReclaimFault}, {ID: "cam4"}} {
		if _, err := res.Add(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	// cam1 LEASED, cam2 and cam3 RUNNING, each for an hour; cam4 free.
	for _, id := range []string{"cam1", "cam2", "cam3"} {
		h, err := res.Lease(ctx, id, "worker-a/"+id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if id != "cam1" {
			if err := h.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		h.Detach()
	}
	if err := res.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	jobs, err := env.JS.KeyValue(ctx, wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Put(ctx, "nightly", []byte(`{"name":"nightly","type":"noop","every":"24h"}`)); err != nil {
		t.Fatal(err)
	}

	store, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := env.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	put := func(id string, state wire.TaskState, seq uint64) {
		t.Helper()
		now := time.Now().UTC()
		rec := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: id, Type: "noop", Queue: "default", State: state, CreatedAt: now, UpdatedAt: now}, Seq: seq}
		if _, err := store.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	// t-ended ran and its message left the stream, but its record was
	// taken before it ended: the restore parks it.
	ended := publishTask(t, env, "t-ended")
	put("t-ended", wire.TaskRunning, ended)
	// t-finished too, and its end is in the audit stream: the restore
	// completes its record from it.
	finished := publishTask(t, env, "t-finished")
	put("t-finished", wire.TaskRunning, finished)
	if err := audit.NewEmitter(env.JS, "workers", nil).Emit(ctx, wire.Event{Type: wire.EventTaskFinished, TaskID: "t-finished",
		Payload: audit.Payload(map[string]any{"state": wire.TaskSucceeded, "attempts": 2})}); err != nil {
		t.Fatal(err)
	}
	// t-moved's message is not at its record's sequence, but another
	// message names it: it is still waiting.
	moved := publishTask(t, env, "t-moved")
	put("t-moved", wire.TaskWaiting, moved)
	// t-done ended and its record says so.
	done := publishTask(t, env, "t-done")
	put("t-done", wire.TaskSucceeded, done)
	for _, seq := range []uint64{ended, finished, moved, done} {
		if err := stream.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := tasks.NewMsg("", "noop", wire.Task{ID: "t-moved"})
	if err != nil {
		t.Fatal(err)
	}
	msg.Header.Del(jetstream.MsgIDHeader)
	if _, err := env.JS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	// t-unpublished's record was written, its message not yet published;
	// t-unrecorded's message was, the record not yet told its sequence.
	put("t-unpublished", wire.TaskWaiting, 0)
	publishTask(t, env, "t-unrecorded")
	put("t-unrecorded", wire.TaskWaiting, 0)
	// Five tasks wait; a worker took two of them and runs them.
	for _, id := range []string{"w-1", "w-2", "w-3", "w-4", "w-5"} {
		put(id, wire.TaskWaiting, publishTask(t, env, id))
	}
	cons, err := env.JS.CreateOrUpdateConsumer(ctx, wire.StreamTasks, jetstream.ConsumerConfig{
		Durable: "gantry-workers-default", FilterSubject: "gantry.tasks.default.>", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 2 {
		t.Fatalf("fetched %d tasks, want 2", n)
	}
	return &system{env: env, tasks: store}
}

func TestTakeAndRestore(t *testing.T) {
	t.Parallel()
	src := setupSystem(t)
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "backup")
	var parts []string
	m, err := Take(ctx, src.env.NC, dir, Config{NoAudit: true, Progress: func(p Progress) {
		if p.Done {
			parts = append(parts, p.Part)
		}
	}})
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	want := []string{"KV_gantry_checkpoints", "KV_gantry_jobs", "KV_gantry_leases", "KV_gantry_queues", "KV_gantry_resources", "KV_gantry_routes",
		"KV_gantry_scheduler", "KV_gantry_workers", "KV_gantry_tasks", wire.StreamTasks, wire.StreamAudit}
	if !slices.Equal(parts, want) {
		t.Errorf("parts done = %v, want %v (buckets, then streams, the audit stream last)", parts, want)
	}
	if m.Audit != nil {
		t.Errorf("Audit = %+v, want none with NoAudit", m.Audit)
	}
	if m.ServerVersion == "" || m.Started.IsZero() || m.Finished.Before(m.Started) {
		t.Errorf("manifest = server %q, started %v, finished %v; want a version and an ordered time span", m.ServerVersion, m.Started, m.Finished)
	}
	var tasksStream wire.BackupStream
	for _, s := range m.Streams {
		if s.Name == wire.StreamTasks {
			tasksStream = s
		}
	}
	if tasksStream.Messages != 7 || tasksStream.Consumers != 1 || tasksStream.Data != "streams/GANTRY_TASKS/stream.arc.s2" {
		t.Errorf("GANTRY_TASKS in manifest = %+v, want 7 messages, 1 consumer, data streams/GANTRY_TASKS/stream.arc.s2", tasksStream)
	}
	if len(m.Files) != 2*len(want) {
		t.Errorf("files = %d, want %d (archive and meta per stream)", len(m.Files), 2*len(want))
	}

	v, err := Verify(dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	dst := brokertest.Start(t)
	got, err := v.Restore(ctx, dst.NC, RestoreConfig{Logger: dst.Log})
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}

	// The tasks wait again, the two delivered ones still pending.
	info, err := dst.JS.Stream(ctx, wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	// 7 tasks, and the review markers of the 2 parked below.
	if n := info.CachedInfo().State.Msgs; n != 9 {
		t.Errorf("restored GANTRY_TASKS messages = %d, want 9", n)
	}
	cons, err := dst.JS.Consumer(ctx, wire.StreamTasks, "gantry-workers-default")
	if err != nil {
		t.Fatalf("restored consumer: %v", err)
	}
	if ci := cons.CachedInfo(); ci.NumAckPending != 2 || ci.NumPending != 5 {
		t.Errorf("restored consumer = %d pending acks, %d waiting; want 2 and 5", ci.NumAckPending, ci.NumPending)
	}

	// No lease survives; the resources are back in service by policy.
	leases, err := dst.JS.KeyValue(ctx, wire.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := kv.Entries(ctx, leases, ""); err != nil || len(keys) != 0 {
		t.Errorf("leases after restore = %d (err %v), want none", len(keys), err)
	}
	if len(got.LeasesRevoked) != 3 {
		t.Errorf("LeasesRevoked = %+v, want the 3 leases", got.LeasesRevoked)
	}
	res, err := lease.NewResources(dst.JS, lease.ResourcesConfig{Audit: audit.NewEmitter(dst.JS, "test", nil)})
	if err != nil {
		t.Fatal(err)
	}
	for id, state := range map[string]wire.ResourceState{
		"cam1": wire.ResourceAvailable, "cam2": wire.ResourceAvailable, "cam3": wire.ResourceFault, "cam4": wire.ResourceAvailable,
	} {
		r, err := res.Get(ctx, id)
		if err != nil || r.State != state || r.LeaseOwner != "" {
			t.Errorf("resource %s = %s held by %q (err %v), want %s and no holder", id, r.State, r.LeaseOwner, err, state)
		}
	}
	if len(got.ResourcesReclaimed) != 3 {
		t.Errorf("ResourcesReclaimed = %d, want 3", len(got.ResourcesReclaimed))
	}
	revoked := streamEvents(t, dst, wire.EventLeaseRevoked)
	if len(revoked) != 3 {
		t.Errorf("LEASE_REVOKED events = %d, want one per lease (3)", len(revoked))
	}
	// One RESOURCE_STATE_CHANGED of the restore per reclaimed resource,
	// saying where it went; the restored stream also holds the source's.
	moves := map[string][]string{}
	for _, ev := range streamEvents(t, dst, wire.EventResourceStateChanged) {
		if ev.Component != "restore" {
			continue
		}
		var p struct {
			From wire.ResourceState `json:"from"`
			To   wire.ResourceState `json:"to"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			t.Fatal(err)
		}
		moves[ev.ResourceID] = append(moves[ev.ResourceID], string(p.From)+"->"+string(p.To))
	}
	wantMoves := map[string][]string{"cam1": {"LEASED->AVAILABLE"}, "cam2": {"RUNNING->AVAILABLE"}, "cam3": {"RUNNING->FAULT"}}
	if !maps.EqualFunc(moves, wantMoves, slices.Equal) {
		t.Errorf("RESOURCE_STATE_CHANGED events of the restore = %v, want one per reclaimed resource: %v", moves, wantMoves)
	}

	// t-ended and t-unpublished are parked; the others keep their state.
	slices.Sort(got.TasksParked)
	if want := []string{"t-ended", "t-unpublished"}; !slices.Equal(got.TasksParked, want) {
		t.Errorf("TasksParked = %v, want %v", got.TasksParked, want)
	}
	store, err := tasks.NewStore(ctx, dst.JS, tasks.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.TasksCompleted, []string{"t-finished"}) {
		t.Errorf("TasksCompleted = %v, want [t-finished]", got.TasksCompleted)
	}
	if rec, _, err := store.Get(ctx, "t-finished"); err != nil || rec.Attempts != 2 || rec.LastError != "" {
		t.Errorf("task t-finished = %d attempts, last error %q (err %v); want 2 and none, from its TASK_FINISHED event", rec.Attempts, rec.LastError, err)
	}
	for id, state := range map[string]wire.TaskState{
		"t-finished": wire.TaskSucceeded, "t-ended": wire.TaskNeedsReview, "t-unpublished": wire.TaskNeedsReview, "t-unrecorded": wire.TaskWaiting, "t-moved": wire.TaskWaiting, "t-done": wire.TaskSucceeded, "w-1": wire.TaskWaiting,
	} {
		rec, _, err := store.Get(ctx, id)
		if err != nil || rec.State != state {
			t.Errorf("task %s = %s (err %v), want %s", id, rec.State, err, state)
		}
	}
	// Each parked task is in review without its message: a marker says so.
	for _, id := range got.TasksParked {
		m, err := info.GetLastMsgForSubject(ctx, wire.ReviewSubject(id))
		if err != nil || m.Header.Get(wire.HeaderNotKept) == "" {
			t.Errorf("review subject of parked %s = %v, %v; want its not-kept marker", id, m, err)
		}
	}
	if evs := streamEvents(t, dst, wire.EventNeedsReview); len(evs) != 2 {
		t.Errorf("NEEDS_REVIEW events = %+v, want one for each parked task", evs)
	}

	// The job is there.
	jobs, err := dst.JS.KeyValue(ctx, wire.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Get(ctx, "nightly"); err != nil {
		t.Errorf("job nightly after restore: %v", err)
	}
}

// streamEvents reads the events of type typ in env's audit stream.
func streamEvents(t *testing.T, env *brokertest.Env, typ wire.EventType) []wire.Event {
	t.Helper()
	ctx := testCtx(t)
	c, err := env.JS.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{FilterSubjects: []string{typ.Subject()}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []wire.Event
	for m := range batch.Messages() {
		var ev wire.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

func TestTakeRefusesNonEmptyDir(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Take(testCtx(t), env.NC, dir, Config{NoAudit: true})
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, kv.ErrInvalid) {
		t.Errorf("Take into a non-empty dir = %v, want ErrInvalid", err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "notes.txt")); err != nil || string(data) != "mine" {
		t.Errorf("notes.txt = %q (err %v), want it untouched", data, err)
	}
}

func TestTakeWithoutAuditdFails(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	dir := filepath.Join(t.TempDir(), "backup")
	_, err := Take(testCtx(t), env.NC, dir, Config{})
	if err == nil || !strings.Contains(err.Error(), "auditd") {
		t.Errorf("Take without auditd = %v, want an error naming auditd", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("backup dir after a failed Take: %v, want it removed", err)
	}
}

// takeSmall takes a backup of an empty system into a new directory.
func takeSmall(t *testing.T) string {
	t.Helper()
	env := brokertest.Start(t)
	publishTask(t, env, "t-1")
	dir := filepath.Join(t.TempDir(), "backup")
	if _, err := Take(testCtx(t), env.NC, dir, Config{NoAudit: true}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestVerifyFindsDamage(t *testing.T) {
	t.Parallel()
	dir := takeSmall(t)
	if _, err := Verify(dir); err != nil {
		t.Fatalf("Verify of a good backup: %v", err)
	}
	archive := filepath.Join("streams", wire.StreamTasks, "stream.arc.s2")
	meta := filepath.Join("streams", "KV_gantry_jobs", metaFile)
	orig, err := os.ReadFile(filepath.Join(dir, archive))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
		want   string
	}{
		{"corrupted", func(dir string) error {
			b := slices.Clone(orig)
			b[len(b)/2] ^= 0xff
			return os.WriteFile(filepath.Join(dir, archive), b, 0o640)
		}, "streams/GANTRY_TASKS/stream.arc.s2: SHA-256 does not match"},
		{"truncated", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, archive), orig[:len(orig)-10], 0o640)
		}, "streams/GANTRY_TASKS/stream.arc.s2: truncated"},
		{"missing", func(dir string) error { return os.Remove(filepath.Join(dir, meta)) }, "streams/KV_gantry_jobs/backup.json: missing"},
		{"no manifest", func(dir string) error { return os.Remove(filepath.Join(dir, wire.BackupManifestFile)) }, "gantry-backup.json: missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, dir)
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			_, err := Verify(dir)
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !errors.Is(err, kv.ErrInvalid) {
				t.Fatalf("Verify = %v, want a *CorruptError matching ErrCorrupt and kv.ErrInvalid", err)
			}
			if len(ce.Problems) != 1 || !strings.HasPrefix(ce.Problems[0], tc.want) {
				t.Errorf("Problems = %q, want one starting %q", ce.Problems, tc.want)
			}
		})
	}
}

// copyDir copies the backup in dir into a new directory.
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.CopyFS(dst, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestRestoreRefusesLiveData(t *testing.T) {
	t.Parallel()
	dir := takeSmall(t)
	v, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	live := brokertest.Start(t)
	publishTask(t, live, "someone-elses")
	_, err = v.Restore(testCtx(t), live.NC, RestoreConfig{})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "fresh data dir") {
		t.Errorf("Restore over a stream with messages = %v, want ErrInvalid asking for a fresh data dir", err)
	}
	info, err := live.JS.Stream(testCtx(t), wire.StreamTasks)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("live GANTRY_TASKS messages = %d, want its 1 untouched", n)
	}
}

func TestTakeUnderKeeps(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := testCtx(t)
	parent := t.TempDir()
	// A partial backup a dead run left behind goes.
	stale := filepath.Join(parent, wire.BackupDirPrefix+"20200101T000000.000Z"+partialSuffix)
	if err := os.MkdirAll(stale, 0o750); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for i := range 3 {
		r, err := TakeUnder(ctx, env.NC, parent, 2, Config{NoAudit: true, TaskID: "task-" + string(rune('a'+i))})
		if err != nil {
			t.Fatalf("TakeUnder %d: %v", i, err)
		}
		if r.Again {
			t.Errorf("TakeUnder %d: Again = true, want a new backup", i)
		}
		dirs = append(dirs, r.Dir)
	}
	names, err := backupsUnder(parent)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Base(dirs[1]), filepath.Base(dirs[2])}; !slices.Equal(names, want) {
		t.Errorf("backups kept = %v, want the newest two %v", names, want)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale partial backup: %v, want it removed", err)
	}
	// The same task again (delivered again, or run on a system restored
	// from its backup) takes nothing new.
	r, err := TakeUnder(ctx, env.NC, parent, 2, Config{NoAudit: true, TaskID: "task-c"})
	if err != nil || !r.Again || r.Dir != dirs[2] {
		t.Errorf("TakeUnder by task-c again = %+v, %v; want Again with %s", r, err, dirs[2])
	}
	if _, err := TakeUnder(ctx, env.NC, parent, -1, Config{NoAudit: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("TakeUnder keep -1 = %v, want ErrInvalid", err)
	}
	for _, d := range names {
		if _, err := Verify(filepath.Join(parent, d)); err != nil {
			t.Errorf("Verify %s: %v", d, err)
		}
	}
}
