package backup

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/tasks"
)

// RestoreConfig tunes Restore.
type RestoreConfig struct {
	// AuditDir is where the audit store goes: the audit directory of the
	// data dir being restored (<data>/audit for gantry run). It must be
	// new or empty. Required when the backup holds the audit store.
	AuditDir string
	// Progress, when set, is called as the restore goes. Defaults to none.
	Progress func(Progress)
	// Logger receives the restore's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// Restored is what Restore did.
type Restored struct {
	// Streams are the restored streams with their messages as restored
	// (a KV key whose TTL ran out since the backup is gone).
	Streams []RestoredStream `json:"streams"`
	// LeasesRevoked are the leases of the backup, each revoked.
	LeasesRevoked []wire.Lease `json:"leases_revoked"`
	// ResourcesReclaimed are the resources those leases held, as they
	// were returned to service.
	ResourcesReclaimed []wire.Resource `json:"resources_reclaimed"`
	// TasksCompleted are the tasks that ended while the backup was taken,
	// after their record was taken and before the task stream was: their
	// records were completed from their TASK_FINISHED events.
	TasksCompleted []string `json:"tasks_completed"`
	// TasksParked are the tasks whose record says they had not finished
	// while the backup holds no message of theirs and no end (a message
	// published after the task stream was taken): each is NEEDS_REVIEW
	// now, with a NEEDS_REVIEW event.
	TasksParked []string `json:"tasks_parked"`
	// AuditFiles counts the audit store's files put in place.
	AuditFiles int `json:"audit_files"`
}

// RestoredStream is one restored stream.
type RestoredStream struct {
	Name     string `json:"name"`
	Messages uint64 `json:"messages"`
	LastSeq  uint64 `json:"last_seq"`
}

// Restore brings the backup back on the server nc is connected to, which
// must be a fresh one (a broker just started on a new data dir): a stream
// it finds there holding messages makes it stop with ErrInvalid, an empty
// one (as the broker provisions them) is replaced. Each stream is restored
// through JetStream's restore API, its consumers' state included, so the
// tasks that waited in the backup wait again and those that ran are
// delivered again once their ack deadline passes.
//
// Then it settles what the restore made stale, each step an audit event
// that auditd stores on the restored system's first start: every lease is
// revoked (LEASE_REVOKED: no lease from before the backup is honoured) and
// the resources they held are returned to service by their reclaim policy
// (RESOURCE_STATE_CHANGED); a task whose record says it had not finished
// while the backup holds no message of it has its record completed from
// its TASK_FINISHED event (it ended while the backup was taken), or, with
// none, is set NEEDS_REVIEW with a NEEDS_REVIEW event. Last, the audit
// store's files go into cfg.AuditDir.
func (v *Verified) Restore(ctx context.Context, nc *nats.Conn, cfg RestoreConfig) (Restored, error) {
	m := v.Manifest
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if m.Audit != nil {
		if cfg.AuditDir == "" {
			return Restored{}, fmt.Errorf("%w: the backup holds the audit store: name a directory for it", ErrInvalid)
		}
		if err := checkEmpty(cfg.AuditDir, "audit store dir"); err != nil {
			return Restored{}, err
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return Restored{}, fmt.Errorf("jetstream: %w", err)
	}
	parts := len(m.Streams)
	if m.Audit != nil {
		parts++
	}
	report := func(p Progress) {
		if cfg.Progress != nil {
			p.Parts = parts
			cfg.Progress(p)
		}
	}
	out := Restored{Streams: []RestoredStream{}, LeasesRevoked: []wire.Lease{}, ResourcesReclaimed: []wire.Resource{},
		TasksCompleted: []string{}, TasksParked: []string{}}
	for i, s := range m.Streams {
		state, err := v.restoreStream(ctx, nc, js, s, func(n int64) {
			report(Progress{Part: s.Name, Index: i + 1, Bytes: n})
		})
		if err != nil {
			return out, fmt.Errorf("restore stream %s: %w", s.Name, err)
		}
		out.Streams = append(out.Streams, RestoredStream{Name: s.Name, Messages: state.Messages, LastSeq: state.LastSeq})
		report(Progress{Part: s.Name, Index: i + 1, Done: true})
		cfg.Logger.Debug("stream restored", "stream", s.Name, "messages", state.Messages)
	}
	if err := settle(ctx, js, m, cfg.Logger, &out); err != nil {
		return out, err
	}
	if m.Audit != nil {
		report(Progress{Part: AuditPart, Index: parts})
		n, err := v.placeAudit(cfg.AuditDir)
		if err != nil {
			return out, fmt.Errorf("restore the audit store: %w", err)
		}
		out.AuditFiles = n
		report(Progress{Part: AuditPart, Index: parts, Done: true})
	}
	return out, nil
}

// restoreStream restores one stream, replacing an empty one of the same
// name and refusing one that holds messages.
func (v *Verified) restoreStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, s wire.BackupStream, progress func(int64)) (streamState, error) {
	existing, err := js.Stream(ctx, s.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return streamState{}, fmt.Errorf("look up: %w", err)
	default:
		if n := existing.CachedInfo().State.Msgs; n > 0 {
			return streamState{}, fmt.Errorf("%w: the server already holds stream %s with %d messages: restore only into a fresh data dir", ErrInvalid, s.Name, n)
		}
		if err := js.DeleteStream(ctx, s.Name); err != nil {
			return streamState{}, fmt.Errorf("replace the empty stream: %w", err)
		}
	}
	meta, err := readMeta(v.Dir, s)
	if err != nil {
		return streamState{}, err
	}
	f, err := os.Open(filepath.Join(v.Dir, filepath.FromSlash(s.Data)))
	if err != nil {
		return streamState{}, err
	}
	defer f.Close()
	return restore(ctx, nc, s.Name, meta, f, progress)
}

// settle revokes the backup's leases, reclaims their resources and
// settles the records of the tasks the backup caught between its
// snapshots (settleTasks).
func settle(ctx context.Context, js jetstream.JetStream, m wire.BackupManifest, log *slog.Logger, out *Restored) error {
	em := audit.NewEmitter(js, "restore", nil)
	res, err := lease.NewResources(js, lease.ResourcesConfig{Audit: em, Logger: log})
	if err != nil {
		return err
	}
	reason := fmt.Sprintf("restored from the backup of %s: leases from before a backup are not honoured", m.Started.Format(time.RFC3339))
	revoked, err := res.Leases().RevokeAll(ctx, reason)
	out.LeasesRevoked = revoked
	if err != nil {
		return err
	}
	moved, err := res.ReclaimAll(ctx, reason)
	for _, r := range moved {
		out.ResourcesReclaimed = append(out.ResourcesReclaimed, r.Resource)
	}
	if err != nil {
		return err
	}
	completed, parked, err := settleTasks(ctx, js, em)
	out.TasksCompleted = append(out.TasksCompleted, completed...)
	out.TasksParked = append(out.TasksParked, parked...)
	if err != nil {
		return err
	}
	if err := res.Flush(ctx); err != nil {
		return fmt.Errorf("audit events of the restore not confirmed stored: %w", err)
	}
	return nil
}

// settleTasks brings up to date the records of tasks that say they had
// not finished while no message of theirs is in the restored task stream,
// and returns the tasks it completed and those it parked. The buckets are
// taken before the streams, so such a task either ended between the two
// (its TASK_FINISHED event is in the audit stream, taken after both: its
// record is completed from it; without one it is parked NEEDS_REVIEW), or
// its record was written just before its message was published, after
// the stream was taken: it is not in the backup, and is parked.
func settleTasks(ctx context.Context, js jetstream.JetStream, em *audit.Emitter) (completed, parked []string, err error) {
	store, err := tasks.NewStore(ctx, js, tasks.StoreConfig{})
	if err != nil {
		return nil, nil, err
	}
	stream, err := js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return nil, nil, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	live, err := store.List(ctx, func(r wire.TaskRecord) bool { return !r.State.Terminal() })
	if err != nil {
		return nil, nil, err
	}
	var gone []wire.TaskRecord
	for _, r := range live {
		if r.Seq == 0 {
			gone = append(gone, r)
			continue
		}
		_, err := stream.GetMsg(ctx, r.Seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			gone = append(gone, r)
		case err != nil:
			return nil, nil, fmt.Errorf("look up task %s: %w", r.ID, err)
		}
	}
	if len(gone) == 0 {
		return nil, nil, nil
	}
	// A task's message may be elsewhere than its record says (a
	// prioritized queue's sorter moved it, a retry published it anew, the
	// record was not yet told): only a task no message names is settled.
	ids, err := streamTaskIDs(ctx, stream)
	if err != nil {
		return nil, nil, err
	}
	ends, err := taskEnds(ctx, js)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now().UTC()
	for _, r := range gone {
		if ids[r.ID] {
			continue
		}
		was := r.State
		r.RetryAt = nil
		if end, ok := ends[r.ID]; ok && r.Seq != 0 {
			r.State, r.UpdatedAt, r.LastError = end.State, end.Time, ""
			r.Attempts = max(r.Attempts, end.Attempts)
			if r.State == wire.TaskNeedsReview {
				r.LastError = fmt.Sprintf("went to NEEDS_REVIEW while the backup was taken; its message is not kept "+
					"(publish it again to retry it); 'gantry audit query --task %s' tells why", r.ID)
			}
			if _, err := store.Put(ctx, r); err != nil {
				return completed, parked, err
			}
			if r.State == wire.TaskNeedsReview {
				if err := tasks.MarkNotKept(ctx, js, r.ID); err != nil {
					return completed, parked, err
				}
			}
			completed = append(completed, r.ID)
			continue
		}
		r.State, r.UpdatedAt = wire.TaskNeedsReview, now
		if r.Seq != 0 {
			r.LastError = fmt.Sprintf("restored from a backup: the task was %s in it, but its message had left the task stream "+
				"while the backup was taken and its end is not in the audit stream; 'gantry audit query --task %s' may tell more", was, r.ID)
		} else {
			r.LastError = fmt.Sprintf("restored from a backup: the task was %s in it, but its message is not in the backup "+
				"(it was published after the task stream was taken): submit it again if it should run", was)
		}
		if _, err := store.Put(ctx, r); err != nil {
			return completed, parked, err
		}
		if err := tasks.MarkNotKept(ctx, js, r.ID); err != nil {
			return completed, parked, err
		}
		if err := em.Emit(ctx, wire.Event{Type: wire.EventNeedsReview, Level: wire.LevelWarn, TaskID: r.ID, ResourceID: r.Resource,
			Message: r.LastError, Payload: audit.Payload(map[string]any{"was": was, "seq": r.Seq})}); err != nil {
			return completed, parked, err
		}
		parked = append(parked, r.ID)
	}
	return completed, parked, nil
}

// taskEnd is how a task ended, from its TASK_FINISHED event.
type taskEnd struct {
	State    wire.TaskState
	Attempts int
	Time     time.Time
}

// taskEnds reads the TASK_FINISHED events of the restored audit stream
// stored since the task records were taken (by the server's clock, less a
// minute), by task id.
func taskEnds(ctx context.Context, js jetstream.JetStream) (map[string]taskEnd, error) {
	records, err := js.Stream(ctx, "KV_"+wire.BucketTasks)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", wire.BucketTasks, err)
	}
	since := records.CachedInfo().State.LastTime.Add(-time.Minute)
	cons, err := js.OrderedConsumer(ctx, wire.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventTaskFinished.Subject()},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", wire.StreamAudit, err)
	}
	ends := map[string]taskEnd{}
	for {
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", wire.StreamAudit, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev wire.Event
			var p struct {
				State    wire.TaskState `json:"state"`
				Attempts int            `json:"attempts"`
			}
			if json.Unmarshal(m.Data(), &ev) != nil || ev.TaskID == "" || json.Unmarshal(ev.Payload, &p) != nil || !p.State.Terminal() {
				continue
			}
			ends[ev.TaskID] = taskEnd{State: p.State, Attempts: p.Attempts, Time: ev.Time}
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("read %s: %w", wire.StreamAudit, err)
		}
		if n == 0 {
			return ends, nil
		}
	}
}

// streamTaskIDs reads every message of the task stream and returns the
// task ids they carry: in the body, as Nats-Msg-Id, or as a sorted
// message's Gantry-Task-Id.
func streamTaskIDs(ctx context.Context, stream jetstream.Stream) (map[string]bool, error) {
	ids := map[string]bool{}
	for seq := uint64(1); ; {
		msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ids, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read stream %s at %d: %w", wire.StreamTasks, seq, err)
		}
		var body struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(msg.Data, &body) == nil && body.ID != "" {
			ids[body.ID] = true
		}
		for _, h := range []string{jetstream.MsgIDHeader, wire.HeaderTaskID} {
			if id := msg.Header.Get(h); id != "" {
				ids[id] = true
			}
		}
		seq = msg.Sequence + 1
	}
}

// placeAudit copies the audit store's files into dir and returns how many.
func (v *Verified) placeAudit(dir string) (int, error) {
	prefix := v.Manifest.Audit.Dir + "/"
	n := 0
	for _, f := range v.Manifest.Files {
		rel, ok := strings.CutPrefix(f.Path, prefix)
		if !ok {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
			return n, err
		}
		if err := copyFile(filepath.Join(v.Dir, filepath.FromSlash(f.Path)), dst); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// copyFile copies src to the new file dst and syncs it.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}
