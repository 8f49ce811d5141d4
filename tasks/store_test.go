package tasks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/tasks"
)

func TestTaskStore(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	s, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rec := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: "t1", Type: "noop", Queue: "default", State: wire.TaskWaiting, CreatedAt: t0, UpdatedAt: t0}}
	rev, err := s.Create(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, rec); !errors.Is(err, tasks.ErrExists) {
		t.Errorf("Create twice = %v, want ErrTaskExists", err)
	}
	rec.State = wire.TaskRunning
	if _, err := s.Update(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, rec, rev); !errors.Is(err, tasks.ErrChanged) {
		t.Errorf("Update at a stale revision = %v, want ErrTaskChanged", err)
	}
	rec.State = wire.TaskSucceeded
	m, err := s.PutMsg(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.PublishMsg(ctx, m); err != nil {
		t.Fatalf("publish PutMsg: %v", err)
	}
	got, _, err := s.Get(ctx, "t1")
	if err != nil || got.State != wire.TaskSucceeded || !got.CreatedAt.Equal(t0) {
		t.Errorf("Get = %+v, %v; want SUCCEEDED created at %v", got.TaskInfo, err, t0)
	}
	if _, _, err := s.Get(ctx, "missing"); !errors.Is(err, tasks.ErrNotFound) {
		t.Errorf("Get(missing) = %v, want ErrTaskNotFound", err)
	}
	if _, _, err := s.Get(ctx, "bad.id"); !errors.Is(err, tasks.ErrNotFound) {
		t.Errorf("Get(bad.id) = %v, want ErrTaskNotFound", err)
	}
	if _, err := s.Put(ctx, wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: "a b"}}); err == nil {
		t.Error("Put with id \"a b\" = nil, want an error")
	}
	rec2 := rec
	rec2.ID, rec2.State, rec2.CreatedAt = "t2", wire.TaskNeedsReview, t0.Add(-time.Hour)
	if _, err := s.Put(ctx, rec2); err != nil {
		t.Fatal(err)
	}
	all, err := s.List(ctx, nil)
	if err != nil || len(all) != 2 || all[0].ID != "t2" || all[1].ID != "t1" {
		t.Errorf("List = %d records (%v), want t2 then t1 (oldest first)", len(all), err)
	}
	review, err := s.List(ctx, func(r wire.TaskRecord) bool { return r.State == wire.TaskNeedsReview })
	if err != nil || len(review) != 1 || review[0].ID != "t2" {
		t.Errorf("List(NEEDS_REVIEW) = %v (%v), want t2", review, err)
	}
	if err := s.Delete(ctx, "t2"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "t2"); !errors.Is(err, tasks.ErrNotFound) {
		t.Errorf("Get after Delete = %v, want ErrTaskNotFound", err)
	}
}

// storedTTL returns the per-message TTL of the stored record of task id, or
// 0 when it has none.
func storedTTL(t *testing.T, env *brokertest.Env, id string) time.Duration {
	t.Helper()
	ctx := context.Background()
	str, err := env.JS.Stream(ctx, "KV_"+wire.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	m, err := str.GetLastMsgForSubject(ctx, "$KV."+wire.BucketTasks+"."+id)
	if err != nil {
		t.Fatalf("raw record of %s: %v", id, err)
	}
	h := m.Header.Get(jetstream.MsgTTLHeader)
	if h == "" {
		return 0
	}
	if n, err := strconv.Atoi(h); err == nil {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(h)
	if err != nil {
		t.Fatalf("%s of %s = %q, want seconds or a duration", jetstream.MsgTTLHeader, id, h)
	}
	return d
}

// TestTaskStoreRetention writes every state through every write of the
// store: SUCCEEDED and CANCELLED records carry the retention as their TTL
// and disappear, the others carry none and stay, and a record written live
// again after it ended stays too.
func TestTaskStoreRetention(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	const retention = time.Second
	s, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := func(id string, st wire.TaskState) wire.TaskRecord {
		return wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: id, Type: "noop", Queue: "default", State: st, CreatedAt: now, UpdatedAt: now}}
	}
	writes := map[string]func(wire.TaskRecord) error{
		"put":    func(r wire.TaskRecord) error { _, err := s.Put(ctx, r); return err },
		"create": func(r wire.TaskRecord) error { _, err := s.Create(ctx, r); return err },
		"update": func(r wire.TaskRecord) error {
			rev, err := s.Create(ctx, rec(r.ID, wire.TaskWaiting))
			if err == nil {
				_, err = s.Update(ctx, r, rev)
			}
			return err
		},
		"putmsg": func(r wire.TaskRecord) error {
			m, err := s.PutMsg(r)
			if err == nil {
				_, err = env.JS.PublishMsg(ctx, m)
			}
			return err
		},
	}
	states := []wire.TaskState{wire.TaskWaiting, wire.TaskRunning, wire.TaskRetryWait, wire.TaskSucceeded, wire.TaskNeedsReview, wire.TaskCancelled}
	ended := func(st wire.TaskState) bool { return st == wire.TaskSucceeded || st == wire.TaskCancelled }
	written := map[string]wire.TaskState{}
	for how, write := range writes {
		for _, st := range states {
			id := how + "-" + strings.ToLower(string(st))
			if err := write(rec(id, st)); err != nil {
				t.Fatalf("%s %s: %v", how, st, err)
			}
			want := time.Duration(0)
			if ended(st) {
				want = retention
			}
			if got := storedTTL(t, env, id); got != want {
				t.Errorf("TTL of %s = %v, want %v", id, got, want)
			}
			written[id] = st
		}
	}
	// Updated at a stale revision, an ended record is refused like any.
	if _, err := s.Update(ctx, rec("update-waiting", wire.TaskSucceeded), 1); !errors.Is(err, tasks.ErrChanged) {
		t.Errorf("Update to SUCCEEDED at a stale revision = %v, want ErrTaskChanged", err)
	}
	// Ended, then live again: the live write drops the TTL.
	rev, err := s.Put(ctx, rec("revived", wire.TaskCancelled))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, rec("revived", wire.TaskWaiting), rev); err != nil {
		t.Fatal(err)
	}
	if got := storedTTL(t, env, "revived"); got != 0 {
		t.Errorf("TTL of revived = %v, want none", got)
	}
	written["revived"] = wire.TaskWaiting
	// Keeping writes an ended record without the TTL.
	if _, err := s.Keeping().Put(ctx, rec("kept", wire.TaskCancelled)); err != nil {
		t.Fatal(err)
	}
	if got := storedTTL(t, env, "kept"); got != 0 {
		t.Errorf("TTL of kept = %v, want none", got)
	}

	// The last record written with the TTL; once it is gone, every record
	// written before it with one is due too.
	if _, err := s.Put(ctx, rec("last", wire.TaskSucceeded)); err != nil {
		t.Fatal(err)
	}
	check.For(t, 15*time.Second, 50*time.Millisecond, func() error {
		if _, _, err := s.Get(ctx, "last"); !errors.Is(err, tasks.ErrNotFound) {
			return fmt.Errorf("Get(last) error = %v after a put with a %v retention, want ErrTaskNotFound", err, retention)
		}
		return nil
	})
	for id, st := range written {
		_, _, err := s.Get(ctx, id)
		gone := errors.Is(err, tasks.ErrNotFound)
		if err != nil && !gone {
			t.Fatal(err)
		}
		if gone != ended(st) {
			t.Errorf("%s (%s): expired = %v after the retention, want %v", id, st, gone, ended(st))
		}
	}
	if _, _, err := s.Get(ctx, "kept"); err != nil {
		t.Errorf("kept (CANCELLED, written by Keeping) = %v after the retention, want it kept", err)
	}
}

func TestTaskStoreRetentionSettings(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	for _, bad := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, -2} {
		if _, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{Retention: bad}); err == nil {
			t.Errorf("NewTaskStore(retention %v) = nil error, want one", bad)
		}
	}
	forever, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{Retention: tasks.KeepForever})
	if err != nil {
		t.Fatal(err)
	}
	def, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[*tasks.Store]time.Duration{forever: 0, def: tasks.DefaultRetention} {
		r := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: fmt.Sprintf("t%d", want), State: wire.TaskSucceeded}}
		if _, err := s.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got := storedTTL(t, env, r.ID); got != want {
			t.Errorf("TTL of a SUCCEEDED record = %v, want %v", got, want)
		}
	}
}

func TestCheckpointStore(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	ctx := context.Background()
	s, err := tasks.NewCheckpointStore(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := s.Load(ctx, "t1"); cp != nil || err != nil {
		t.Errorf("Load before Save = %v, %v; want nil, nil", cp, err)
	}
	want := wire.Checkpoint{Stage: "upload", LastItem: "f7", Counts: map[string]int64{"done": 7}, Attempt: 1, UpdatedAt: time.Now().UTC()}
	if err := s.Save(ctx, "t1", want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx, "t1")
	if err != nil || got == nil || got.Stage != "upload" || got.LastItem != "f7" || got.Counts["done"] != 7 {
		t.Errorf("Load = %+v, %v; want the saved checkpoint", got, err)
	}

	// Operation keys: new, then done; one left started is in doubt; an
	// aborted one may run again.
	if st, err := s.BeginOp(ctx, "t1", "send"); st != tasks.OpNew || err != nil {
		t.Errorf("BeginOp(send) = %v, %v; want OpNew", st, err)
	}
	if st, _ := s.BeginOp(ctx, "t1", "send"); st != tasks.OpInDoubt {
		t.Errorf("BeginOp of a started op = %v, want OpInDoubt", st)
	}
	if err := s.FinishOp(ctx, "t1", "send"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.BeginOp(ctx, "t1", "send"); st != tasks.OpDone {
		t.Errorf("BeginOp of a finished op = %v, want OpDone", st)
	}
	if st, _ := s.BeginOp(ctx, "t1", "charge card"); st != tasks.OpNew {
		t.Errorf("BeginOp(charge card) = %v, want OpNew", st)
	}
	if err := s.AbortOp(ctx, "t1", "charge card"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.BeginOp(ctx, "t1", "charge card"); st != tasks.OpNew {
		t.Errorf("BeginOp after AbortOp = %v, want OpNew", st)
	}
	if st, _ := s.BeginOp(ctx, "t10", "send"); st != tasks.OpNew {
		t.Errorf("BeginOp(t10, send) = %v, want OpNew (not t1's)", st)
	}
	if err := s.Clear(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if cp, _ := s.Load(ctx, "t1"); cp != nil {
		t.Errorf("Load after Clear = %+v, want nil", cp)
	}
	if st, _ := s.BeginOp(ctx, "t1", "send"); st != tasks.OpNew {
		t.Errorf("BeginOp after Clear = %v, want OpNew", st)
	}
	if st, _ := s.BeginOp(ctx, "t10", "send"); st != tasks.OpInDoubt {
		t.Errorf("t10's op after clearing t1 = %v, want OpInDoubt (untouched)", st)
	}

	// Dedupe keys.
	if owner, err := s.ClaimKey(ctx, "nightly", "a", time.Hour); owner != "a" || err != nil {
		t.Errorf("ClaimKey(a) = %q, %v; want a", owner, err)
	}
	if owner, err := s.ClaimKey(ctx, "nightly", "b", time.Hour); owner != "a" || err != nil {
		t.Errorf("ClaimKey(b) = %q, %v; want a (the first claimant)", owner, err)
	}
	if owner, err := s.ClaimKey(ctx, "nightly", "a", time.Hour); owner != "a" || err != nil {
		t.Errorf("ClaimKey(a) again = %q, %v; want a", owner, err)
	}
}

// FuzzPutMsg checks that a record is encoded as json.Marshal encodes it.
func FuzzPutMsg(f *testing.F) {
	for _, s := range [][3]string{
		{"SUCCEEDED", "", "w-1"},
		{"NEEDS_REVIEW", "exit status 1: <no such file> & \"quoted\"", "höst-1"},
		{"RETRY_WAIT", "line\nbreak\ttab", ""},
		{"", "\u2028", "\\"},
	} {
		f.Add(s[0], s[1], s[2], int64(1764515075123456789), 3, uint64(42), true)
	}
	f.Fuzz(func(t *testing.T, state, lastError, worker string, ns int64, n int, seq uint64, times bool) {
		at := time.Unix(0, ns).In(time.FixedZone("X", -7200))
		r := wire.TaskRecord{TaskInfo: wire.TaskInfo{ID: "t-1", Type: "noop", Queue: "default", State: wire.TaskState(state),
			Attempts: n, LastError: lastError, Resource: worker, CreatedAt: at, UpdatedAt: at.UTC()},
			Deliveries: n, Delays: -n, MaxAttempts: n, Priority: n, Key: lastError, Seq: seq, Worker: worker, Output: lastError}
		if times {
			r.NotBefore, r.RetryAt = &at, &r.UpdatedAt
		}
		want, wantErr := json.Marshal(r)
		m, err := (&tasks.Store{}).PutMsg(r)
		if (err != nil) != (wantErr != nil) || (err == nil && !bytes.Equal(m.Data, want)) {
			var got []byte
			if m != nil {
				got = m.Data
			}
			t.Errorf("PutMsg data = %s, %v; want %s, %v", got, err, want, wantErr)
		}
	})
}
