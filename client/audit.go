package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/rpc"
)

// noAuditd says what to start when no audit service answers.
const noAuditd = "no audit service answers (is auditd running? it runs in 'gantry run' and 'gantry auditd')"

// request asks the service on subject, bounded by the client's timeout
// unless ctx has a deadline. When no service answers, the error starts
// with hint, which says what to start.
func (c *Client) request(ctx context.Context, subject, hint string, req, reply any) error {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	err := rpc.Request(ctx, c.nc, subject, req, reply)
	if errors.Is(err, rpc.ErrNoResponders) {
		return fmt.Errorf("%s: %w", hint, err)
	}
	return err
}

// QueryAudit asks auditd (on gantry.api.audit.query, from any machine) for
// one page of the stored events q selects, oldest first. The page's
// Cursor, sent back in q.Cursor with the same filters, continues it. A
// query auditd cannot answer as asked (a bad cursor, a limit out of range)
// is ErrInvalid; no auditd is ErrUnavailable.
func (c *Client) QueryAudit(ctx context.Context, q AuditQuery) (AuditPage, error) {
	var page AuditPage
	err := c.request(ctx, wire.SubjectAuditQuery, noAuditd, q, &page)
	return page, err
}

// AuditStats asks auditd for its counters.
func (c *Client) AuditStats(ctx context.Context) (AuditStats, error) {
	var stats AuditStats
	err := c.request(ctx, wire.SubjectAuditStats, noAuditd, nil, &stats)
	return stats, err
}

// BackupAudit asks auditd for an online backup of its store and fetches it
// into dir (created; it must not exist or be empty), checking every file's
// size and SHA-256, then writes wire.AuditBackupManifest and deletes the
// hand-over copies. dir is then a store auditd opens.
func (c *Client) BackupAudit(ctx context.Context, dir string) (AuditBackup, error) {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return AuditBackup{}, fmt.Errorf("%w: backup dir %s is not empty: name a new or empty directory", ErrInvalid, dir)
	}
	var reply AuditBackup
	if err := c.request(ctx, wire.SubjectAuditBackup, noAuditd, wire.AuditBackupRequest{}, &reply); err != nil {
		return AuditBackup{}, err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	obs, err := c.js.ObjectStore(ctx, wire.BucketAuditBackups)
	if err != nil {
		return AuditBackup{}, fmt.Errorf("backup bucket %s: %w", wire.BucketAuditBackups, err)
	}
	defer func() {
		for _, f := range reply.Files {
			_ = obs.Delete(context.WithoutCancel(ctx), reply.Name+"/"+f.Path)
		}
	}()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return AuditBackup{}, fmt.Errorf("create backup dir: %w", err)
	}
	for _, f := range reply.Files {
		if err := fetchFile(ctx, obs, reply.Name, f, dir); err != nil {
			return AuditBackup{}, err
		}
	}
	manifest, err := json.MarshalIndent(reply, "", "  ")
	if err != nil {
		return AuditBackup{}, fmt.Errorf("encode manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, wire.AuditBackupManifest), append(manifest, '\n'), 0o640); err != nil {
		return AuditBackup{}, fmt.Errorf("write manifest: %w", err)
	}
	return reply, nil
}

// fetchFile copies one backup file from obs into dir and checks it.
func fetchFile(ctx context.Context, obs jetstream.ObjectStore, name string, f wire.AuditBackupFile, dir string) error {
	local := filepath.FromSlash(f.Path)
	if !filepath.IsLocal(local) {
		return fmt.Errorf("backup file %q escapes the backup dir", f.Path)
	}
	dst := filepath.Join(dir, local)
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(dst), err)
	}
	r, err := obs.Get(ctx, name+"/"+f.Path)
	if err != nil {
		return fmt.Errorf("get backup file %s: %w", f.Path, err)
	}
	defer r.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("create backup file: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), r)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fetch backup file %s: %w", f.Path, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != f.Size || sum != f.SHA256 {
		return fmt.Errorf("backup file %s: got %d bytes sha256 %s, want %d bytes sha256 %s", f.Path, n, sum, f.Size, f.SHA256)
	}
	return nil
}

// TailAudit follows the audit events published on gantry.audit.> (through
// the GANTRY_AUDIT stream; no auditd needed) that pass q's field filters,
// from now on, or from since when it is not zero (as far back as the
// stream keeps them). It yields each event, redacted, until ctx ends (then
// it stops without an error) or the loop breaks. A message that is not an
// event yields an error matching ErrMalformedEvent and the tail goes on;
// any other error ends it.
func (c *Client) TailAudit(ctx context.Context, q AuditQuery, since time.Time) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		occ := jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{wire.SubjectAuditAll},
			DeliverPolicy:  jetstream.DeliverNewPolicy,
		}
		if q.Type != "" {
			occ.FilterSubjects = []string{q.Type.Subject()}
		}
		if !since.IsZero() {
			occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
		}
		cctx, cancel := c.bound(ctx)
		cons, err := c.js.OrderedConsumer(cctx, wire.StreamAudit, occ)
		cancel()
		if err != nil {
			yield(Event{}, fmt.Errorf("follow %s: %w", wire.StreamAudit, err))
			return
		}
		it, err := cons.Messages()
		if err != nil {
			yield(Event{}, fmt.Errorf("follow %s: %w", wire.StreamAudit, err))
			return
		}
		defer it.Stop()
		stop := context.AfterFunc(ctx, it.Stop)
		defer stop()
		for {
			m, err := it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return
			}
			if err != nil {
				yield(Event{}, fmt.Errorf("follow %s: %w", wire.StreamAudit, err))
				return
			}
			var ev Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				if !yield(Event{}, fmt.Errorf("%w on %s: %v", ErrMalformedEvent, m.Subject(), err)) {
					return
				}
				continue
			}
			if !q.Matches(&ev) {
				continue
			}
			wire.RedactEvent(&ev)
			if !yield(ev, nil) {
				return
			}
		}
	}
}
