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
	// TasksParked are the tasks whose record was left unfinished though
	// their message had left the stream before it was taken: they ended
	// while the backup ran. Each is NEEDS_REVIEW now.
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
// but whose message had already left the stream (it ended while the backup
// was taken) is set NEEDS_REVIEW. Last, the audit store's files go into
// cfg.AuditDir.
func (v *Verified) Restore(ctx context.Context, nc *nats.Conn, cfg RestoreConfig) (Restored, error) {
	m := v.Manifest
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if m.Audit != nil {
		if cfg.AuditDir == "" {
			return Restored{}, fmt.Errorf("%w: the backup holds the audit store: name a directory for it", ErrInvalid)
		}
		if err := checkEmpty(cfg.AuditDir); err != nil {
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
	out := Restored{Streams: []RestoredStream{}, TasksParked: []string{}, ResourcesReclaimed: []wire.Resource{}}
	for i, s := range m.Streams {
		state, err := v.restoreStream(ctx, nc, js, s, func(n int64) {
			report(Progress{Part: s.Name, Index: i + 1, Bytes: n})
		})
		if err != nil {
			return out, fmt.Errorf("restore stream %s: %w", s.Name, err)
		}
		out.Streams = append(out.Streams, RestoredStream{Name: s.Name, Messages: state.Messages, LastSeq: state.LastSeq})
		report(Progress{Part: s.Name, Index: i + 1, Done: true})
		cfg.Logger.Info("stream restored", "stream", s.Name, "messages", state.Messages)
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

// settle revokes the backup's leases, reclaims their resources and parks
// the records of tasks that ended while the backup was taken.
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
	parked, err := parkEnded(ctx, js, em)
	out.TasksParked = append(out.TasksParked, parked...)
	if err != nil {
		return err
	}
	if err := res.Flush(ctx); err != nil {
		return fmt.Errorf("audit events of the restore not confirmed stored: %w", err)
	}
	return nil
}

// parkEnded sets NEEDS_REVIEW the tasks whose record says they had not
// finished while no message of theirs is in the restored task stream. The
// buckets are taken before the streams, so such a task ended (or was
// cancelled) between the two: its record is older than its end, and the
// audit store, taken after both, tells how it ended.
func parkEnded(ctx context.Context, js jetstream.JetStream, em *audit.Emitter) ([]string, error) {
	store, err := tasks.NewStore(ctx, js, tasks.StoreConfig{})
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, wire.StreamTasks)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", wire.StreamTasks, err)
	}
	live, err := store.List(ctx, func(r wire.TaskRecord) bool { return !r.State.Terminal() && r.Seq != 0 })
	if err != nil {
		return nil, err
	}
	var gone []wire.TaskRecord
	for _, r := range live {
		_, err := stream.GetMsg(ctx, r.Seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			gone = append(gone, r)
		case err != nil:
			return nil, fmt.Errorf("look up task %s: %w", r.ID, err)
		}
	}
	if len(gone) == 0 {
		return nil, nil
	}
	// A task's message may have moved (a prioritized queue's sorter moves
	// it to gantry.ready): only a task no message names has ended.
	ids, err := streamTaskIDs(ctx, stream)
	if err != nil {
		return nil, err
	}
	var parked []string
	now := time.Now().UTC()
	for _, r := range gone {
		if ids[r.ID] {
			continue
		}
		was := r.State
		r.State, r.RetryAt, r.UpdatedAt = wire.TaskNeedsReview, nil, now
		r.LastError = fmt.Sprintf("restored from a backup: the task was %s in it, but its message had left the task stream, "+
			"so it ended while the backup was taken; 'gantry audit query --task %s' tells how", was, r.ID)
		if _, err := store.Put(ctx, r); err != nil {
			return parked, err
		}
		if err := em.Emit(ctx, wire.Event{Type: wire.EventNeedsReview, Level: wire.LevelWarn, TaskID: r.ID, ResourceID: r.Resource,
			Message: r.LastError, Payload: audit.Payload(map[string]any{"was": was, "seq": r.Seq})}); err != nil {
			return parked, err
		}
		parked = append(parked, r.ID)
	}
	return parked, nil
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
