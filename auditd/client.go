package auditd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/broker/wire"
)

// BackupManifest is the file a fetched backup carries next to the store's
// files: what was backed up, when, with each file's size and SHA-256.
const BackupManifest = "gantry-audit-backup.json"

// ServiceError is an error answer of the audit service.
type ServiceError struct {
	// Code is "400" for a bad request, "503" while the store is failed,
	// "500" otherwise.
	Code        string
	Description string
}

func (e *ServiceError) Error() string { return e.Description }

// ErrNoService is returned when no auditd answers.
var ErrNoService = errors.New("no audit service answers (is auditd running? it runs in 'gantry run' and 'gantry auditd')")

// Request sends req to subject on the audit service and decodes the answer
// into reply.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return ErrNoService
	}
	if err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &ServiceError{Code: code, Description: msg.Header.Get(micro.ErrorHeader)}
	}
	if err := json.Unmarshal(msg.Data, reply); err != nil {
		return fmt.Errorf("decode reply of %s: %w", subject, err)
	}
	return nil
}

// Query asks the audit service for one page.
func Query(ctx context.Context, nc *nats.Conn, q wire.AuditQuery) (wire.AuditPage, error) {
	var page wire.AuditPage
	err := Request(ctx, nc, wire.SubjectAuditQuery, q, &page)
	return page, err
}

// Backup asks the audit service for an online backup and fetches it into
// dir (created; it must not exist or be empty), checking every file's size
// and SHA-256, then writes BackupManifest and deletes the files from the
// hand-over bucket. dir then opens with OpenStore.
func Backup(ctx context.Context, nc *nats.Conn, dir string) (wire.AuditBackupReply, error) {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return wire.AuditBackupReply{}, fmt.Errorf("backup dir %s is not empty: name a new or empty directory", dir)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("jetstream: %w", err)
	}
	var reply wire.AuditBackupReply
	if err := Request(ctx, nc, wire.SubjectAuditBackup, wire.AuditBackupRequest{}, &reply); err != nil {
		return wire.AuditBackupReply{}, err
	}
	obs, err := js.ObjectStore(ctx, wire.BucketAuditBackups)
	if err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("backup bucket %s: %w", wire.BucketAuditBackups, err)
	}
	defer func() {
		for _, f := range reply.Files {
			_ = obs.Delete(context.WithoutCancel(ctx), reply.Name+"/"+f.Path)
		}
	}()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("create backup dir: %w", err)
	}
	for _, f := range reply.Files {
		if err := fetchFile(ctx, obs, reply.Name, f, dir); err != nil {
			return wire.AuditBackupReply{}, err
		}
	}
	manifest, err := json.MarshalIndent(reply, "", "  ")
	if err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("encode manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, BackupManifest), append(manifest, '\n'), 0o640); err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("write manifest: %w", err)
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
