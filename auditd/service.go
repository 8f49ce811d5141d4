package auditd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
)

// serviceVersion is the micro service's version.
const serviceVersion = "1.0.0"

// backupTTL is how long backup files stay in BucketAuditBackups.
const backupTTL = time.Hour

// addService registers the "gantry-audit" micro service.
func (s *Service) addService() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        wire.AuditServiceName,
		Version:     serviceVersion,
		Description: "gantry audit store: query, backup and stats",
	})
	if err != nil {
		return nil, fmt.Errorf("add service %s: %w", wire.AuditServiceName, err)
	}
	for _, ep := range []struct {
		name, subject string
		h             micro.HandlerFunc
	}{
		{"query", wire.SubjectAuditQuery, s.handleQuery},
		{"backup", wire.SubjectAuditBackup, s.handleBackup},
		{"stats", wire.SubjectAuditStats, func(r micro.Request) { _ = r.RespondJSON(s.Stats()) }},
	} {
		if err := svc.AddEndpoint(ep.name, ep.h, micro.WithEndpointSubject(ep.subject)); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("add endpoint %s: %w", ep.subject, err)
		}
	}
	return svc, nil
}

// Service error codes, in the Nats-Service-Error-Code header.
const (
	codeBadRequest  = "400"
	codeUnavailable = "503"
	codeInternal    = "500"
)

func (s *Service) handleQuery(r micro.Request) {
	var q wire.AuditQuery
	if len(r.Data()) > 0 {
		if err := json.Unmarshal(r.Data(), &q); err != nil {
			_ = r.Error(codeBadRequest, "query is not a JSON audit query: "+err.Error(), nil)
			return
		}
	}
	page, err := s.store.Query(q)
	if err != nil {
		s.respondError(r, err)
		return
	}
	_ = r.RespondJSON(page)
}

func (s *Service) respondError(r micro.Request, err error) {
	code := codeInternal
	switch {
	case errors.Is(err, ErrBadQuery):
		code = codeBadRequest
	case errors.Is(err, ErrUnavailable):
		code = codeUnavailable
	}
	_ = r.Error(code, err.Error(), nil)
}

func (s *Service) handleBackup(r micro.Request) {
	var req wire.AuditBackupRequest
	if len(r.Data()) > 0 {
		if err := json.Unmarshal(r.Data(), &req); err != nil {
			_ = r.Error(codeBadRequest, "request is not a JSON backup request: "+err.Error(), nil)
			return
		}
	}
	if req.Name == "" {
		req.Name = ulid.Make().String()
	}
	if !wire.ValidToken(req.Name) || filepath.Base(req.Name) != req.Name {
		_ = r.Error(codeBadRequest, fmt.Sprintf("backup name %q: want one word without '.', '/', '*', '>' or spaces", req.Name), nil)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reply, err := s.backup(ctx, req.Name)
	if err != nil {
		s.log.Error("audit backup", "name", req.Name, "err", err)
		s.respondError(r, err)
		return
	}
	s.log.Info("audit backup", "name", req.Name, "files", len(reply.Files))
	_ = r.RespondJSON(reply)
}

// scratchPattern names the scratch directories of backups, next to the
// store.
const scratchPattern = ".audit-backup-"

// removeStaleBackups removes the scratch directories a backup interrupted
// by a crash left next to the store.
func (s *Service) removeStaleBackups() {
	stale, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Clean(s.cfg.Dir)), scratchPattern+"*"))
	for _, dir := range stale {
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("remove stale backup scratch dir", "dir", dir, "err", err)
		}
	}
}

// backup checkpoints the store into a scratch directory next to it and
// puts every file into BucketAuditBackups as <name>/<path>.
func (s *Service) backup(ctx context.Context, name string) (wire.AuditBackupReply, error) {
	scratch, err := os.MkdirTemp(filepath.Dir(filepath.Clean(s.cfg.Dir)), scratchPattern)
	if err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("backup scratch dir: %w", err)
	}
	defer func() { _ = os.RemoveAll(scratch) }()
	ckpt := filepath.Join(scratch, "store")
	at := s.cfg.Clock.Now().UTC()
	if err := s.store.Checkpoint(ckpt); err != nil {
		return wire.AuditBackupReply{}, err
	}
	obs, err := s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      wire.BucketAuditBackups,
		Description: "gantry audit store backups in transit (gantry audit backup)",
		TTL:         backupTTL,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("backup bucket %s: %w", wire.BucketAuditBackups, err)
	}
	reply := wire.AuditBackupReply{Name: name, Time: at, Files: []wire.AuditBackupFile{}}
	err = filepath.WalkDir(ckpt, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(ckpt, path)
		if err != nil {
			return err
		}
		f, err := putFile(ctx, obs, name+"/"+filepath.ToSlash(rel), path)
		if err != nil {
			return err
		}
		f.Path = filepath.ToSlash(rel)
		reply.Files = append(reply.Files, f)
		return nil
	})
	if err != nil {
		return wire.AuditBackupReply{}, fmt.Errorf("upload backup %s: %w", name, err)
	}
	return reply, nil
}

// putFile puts the file at path into obs as object, returning its size and
// SHA-256.
func putFile(ctx context.Context, obs jetstream.ObjectStore, object, path string) (wire.AuditBackupFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return wire.AuditBackupFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: object}, io.TeeReader(f, h))
	if err != nil {
		return wire.AuditBackupFile{}, fmt.Errorf("put %s: %w", object, err)
	}
	return wire.AuditBackupFile{Size: int64(info.Size), SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
