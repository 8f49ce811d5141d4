package auditd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"github.com/gantry-dev/gantry/internal/rpc"
	"github.com/gantry-dev/gantry/kv"
)

// backupTTL is how long backup files stay in BucketAuditBackups.
const backupTTL = time.Hour

// addService registers the "gantry-audit" micro service.
func (s *Service) addService() (micro.Service, error) {
	return rpc.AddService(s.nc, wire.AuditServiceName, "gantry audit store: query, backup and stats",
		rpc.Endpoint{Name: "query", Subject: wire.SubjectAuditQuery, Handler: s.handleQuery},
		rpc.Endpoint{Name: "backup", Subject: wire.SubjectAuditBackup, Handler: s.handleBackup},
		rpc.Endpoint{Name: "stats", Subject: wire.SubjectAuditStats, Handler: func(r micro.Request) {
			s.respond(r, s.Stats(), nil)
		}},
	)
}

// respond answers r, logging an answer that could not be sent.
func (s *Service) respond(r micro.Request, v any, err error) {
	if rerr := rpc.Respond(r, v, err); rerr != nil {
		s.log.Warn("audit service reply not sent", "subject", r.Subject(), "err", rerr)
	}
}

func (s *Service) handleQuery(r micro.Request) {
	var q wire.AuditQuery
	if err := rpc.Decode(r, &q); err != nil {
		s.respond(r, nil, err)
		return
	}
	page, err := s.store.Query(q)
	s.respond(r, page, err)
}

func (s *Service) handleBackup(r micro.Request) {
	var req wire.AuditBackupRequest
	if err := rpc.Decode(r, &req); err != nil {
		s.respond(r, nil, err)
		return
	}
	if req.Name == "" {
		req.Name = ulid.Make().String()
	}
	if !wire.ValidToken(req.Name) || filepath.Base(req.Name) != req.Name {
		s.respond(r, nil, fmt.Errorf("%w: backup name %q: want one word without '.', '/', '*', '>' or spaces", kv.ErrInvalid, req.Name))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reply, err := s.backup(ctx, req.Name)
	if err != nil {
		s.log.Error("audit backup", "name", req.Name, "err", err)
		s.respond(r, nil, err)
		return
	}
	s.log.Info("audit backup", "name", req.Name, "files", len(reply.Files))
	s.respond(r, reply, nil)
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
