package backup

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/kv"
)

// Errors checked with errors.Is. Both match kv.ErrInvalid (and so
// client.ErrInvalid): the CLI exits 2 on them.
var (
	// ErrInvalid: a backup or restore asked into a directory that is not
	// new or empty, or a restore that would overwrite data. It is
	// kv.ErrInvalid.
	ErrInvalid = kv.ErrInvalid
	// ErrCorrupt: a backup whose manifest is unreadable, or a file of
	// which is missing or does not match its size and SHA-256 (a
	// *CorruptError says which).
	ErrCorrupt = kv.Sentinel("backup is damaged", kv.ErrInvalid)
)

// The layout of a backup directory.
const (
	// streamsDir holds one directory per stream, as `nats stream backup`
	// writes it: the meta file and the archive.
	streamsDir = "streams"
	metaFile   = "backup.json"
	// auditDir holds the audit store's checkpoint.
	auditDir = "audit"
)

// Config tunes Take.
type Config struct {
	// NoAudit leaves the audit store out; otherwise auditd must answer.
	// Defaults to false.
	NoAudit bool
	// TaskID names the backup task taking the backup, recorded in the
	// manifest. Defaults to none.
	TaskID string
	// Progress, when set, is called as the backup goes. Defaults to none.
	Progress func(Progress)
	// AuditTimeout bounds auditd's checkpoint and its transfer. Defaults
	// to 10 minutes.
	AuditTimeout time.Duration
}

// Progress is where a backup or a restore is.
type Progress struct {
	// Part is the stream being taken or restored, or "audit".
	Part string
	// Index counts the parts from 1 to Parts.
	Index, Parts int
	// Bytes is how much of Part is written or sent so far.
	Bytes int64
	// Done is set once Part is complete.
	Done bool
}

// AuditPart is the Progress.Part of the audit store.
const AuditPart = "audit"

// Take backs up every gantry stream and KV bucket on the server nc is
// connected to, through JetStream's snapshot API (messages and consumer
// state), and the audit store through auditd's checkpoint, into dir, which
// must be new or empty (ErrInvalid otherwise). It works while the system
// runs and from any machine: everything travels over NATS.
//
// The buckets are taken first, then the streams, the audit stream last,
// then the audit store: so every task in the backup's task stream has its
// record as of no later than its message, and the audit store holds at
// least every event the audit stream's consumer had acknowledged.
//
// The manifest (wire.BackupManifestFile) is written last, once every file
// is on disk: a directory without one is not a backup. On failure Take
// removes what it wrote.
func Take(ctx context.Context, nc *nats.Conn, dir string, cfg Config) (m wire.BackupManifest, err error) {
	if err := checkEmpty(dir, "backup dir"); err != nil {
		return wire.BackupManifest{}, err
	}
	cfg.AuditTimeout = cmp.Or(cfg.AuditTimeout, 10*time.Minute)
	_, statErr := os.Stat(dir)
	created := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return wire.BackupManifest{}, fmt.Errorf("create backup dir: %w", err)
	}
	defer func() {
		if err == nil {
			return
		}
		if created {
			_ = os.RemoveAll(dir)
			return
		}
		removeContents(dir)
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return wire.BackupManifest{}, fmt.Errorf("jetstream: %w", err)
	}
	streams, err := gantryStreams(ctx, js)
	if err != nil {
		return wire.BackupManifest{}, err
	}
	m = wire.BackupManifest{
		Format: wire.BackupFormat, GantryVersion: gantryVersion(), ServerVersion: nc.ConnectedServerVersion(),
		ServerName: nc.ConnectedServerName(), Started: time.Now().UTC(), TaskID: cfg.TaskID,
		Streams: []wire.BackupStream{}, Files: []wire.BackupFile{},
	}
	parts := len(streams)
	if !cfg.NoAudit {
		parts++
	}
	report := func(p Progress) {
		if cfg.Progress != nil {
			p.Parts = parts
			cfg.Progress(p)
		}
	}
	archive := archiveName(m.ServerVersion)
	for i, name := range streams {
		s, files, err := takeStream(ctx, nc, dir, name, archive, func(n int64) {
			report(Progress{Part: name, Index: i + 1, Bytes: n})
		})
		if err != nil {
			return wire.BackupManifest{}, fmt.Errorf("back up stream %s: %w", name, err)
		}
		m.Streams = append(m.Streams, s)
		m.Files = append(m.Files, files...)
		report(Progress{Part: name, Index: i + 1, Bytes: files[0].Size, Done: true})
	}
	if !cfg.NoAudit {
		report(Progress{Part: AuditPart, Index: parts})
		a, files, err := takeAudit(ctx, nc, dir, cfg.AuditTimeout)
		if err != nil {
			return wire.BackupManifest{}, fmt.Errorf("back up the audit store: %w", err)
		}
		m.Audit = &a
		m.Files = append(m.Files, files...)
		var size int64
		for _, f := range files {
			size += f.Size
		}
		report(Progress{Part: AuditPart, Index: parts, Bytes: size, Done: true})
	}
	m.Finished = time.Now().UTC()
	if err := writeManifest(dir, m); err != nil {
		return wire.BackupManifest{}, err
	}
	return m, nil
}

// gantryStreams lists the streams a backup takes, in the order it takes
// them: the KV buckets (the task records last, right before the task
// stream, so that few tasks end in between), then the streams, the task
// stream first and the audit stream last. The lines of those waiting for a
// resource (gantry_waiters) are not taken: they belong to processes that
// live now, and a restored system, which honours no lease from before its
// backup, starts with empty lines. It refuses a server that lacks the task
// stream (not gantry's).
func gantryStreams(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var buckets, streams []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		switch {
		case name == "KV_"+wire.BucketWaiters:
		case strings.HasPrefix(name, "KV_gantry_"):
			buckets = append(buckets, name)
		case strings.HasPrefix(name, "GANTRY_") && name != wire.StreamAudit:
			streams = append(streams, name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	if !slices.Contains(streams, wire.StreamTasks) {
		return nil, fmt.Errorf("no stream %s on the server: is it gantry's broker?", wire.StreamTasks)
	}
	slices.Sort(buckets)
	if i := slices.Index(buckets, "KV_"+wire.BucketTasks); i >= 0 {
		buckets = append(slices.Delete(buckets, i, i+1), "KV_"+wire.BucketTasks)
	}
	slices.Sort(streams)
	streams = slices.DeleteFunc(streams, func(s string) bool { return s == wire.StreamTasks })
	out := append(buckets, wire.StreamTasks)
	out = append(out, streams...)
	return append(out, wire.StreamAudit), nil
}

// archiveName is what `nats stream backup` calls a stream's archive:
// servers from 2.15 on send the NATSARC1 format, older ones a tar.
func archiveName(serverVersion string) string {
	major, minor := 0, 0
	parts := strings.SplitN(strings.TrimPrefix(serverVersion, "v"), ".", 3)
	if len(parts) >= 2 {
		major, _ = strconv.Atoi(parts[0])
		minor, _ = strconv.Atoi(parts[1])
	}
	if major > 2 || major == 2 && minor >= 15 {
		return "stream.arc.s2"
	}
	return "stream.tar.s2"
}

// takeStream snapshots stream into dir/streams/<name>/: the archive and
// the meta file, in that order in the returned files.
func takeStream(ctx context.Context, nc *nats.Conn, dir, name, archive string, progress func(int64)) (wire.BackupStream, []wire.BackupFile, error) {
	rel := path.Join(streamsDir, name)
	if err := os.MkdirAll(filepath.Join(dir, filepath.FromSlash(rel)), 0o750); err != nil {
		return wire.BackupStream{}, nil, fmt.Errorf("create stream dir: %w", err)
	}
	at := time.Now().UTC()
	var meta []byte
	var state streamState
	data, err := writeFile(dir, path.Join(rel, archive), func(w io.Writer) error {
		var err error
		meta, state, err = snapshot(ctx, nc, name, w, progress)
		return err
	})
	if err != nil {
		return wire.BackupStream{}, nil, err
	}
	metaF, err := writeFile(dir, path.Join(rel, metaFile), func(w io.Writer) error {
		_, err := w.Write(append(meta, '\n'))
		return err
	})
	if err != nil {
		return wire.BackupStream{}, nil, err
	}
	s := wire.BackupStream{
		Name: name, Bucket: strings.TrimPrefix(name, "KV_"), Time: at,
		Messages: state.Messages, Bytes: state.Bytes, FirstSeq: state.FirstSeq, LastSeq: state.LastSeq,
		Consumers: state.Consumers, Data: data.Path, Meta: metaF.Path,
	}
	if s.Bucket == name {
		s.Bucket = ""
	}
	return s, []wire.BackupFile{data, metaF}, nil
}

// takeAudit has auditd checkpoint its store and fetches it into
// dir/audit (client.BackupAudit, which checks every file's size and
// SHA-256 as auditd computed them).
func takeAudit(ctx context.Context, nc *nats.Conn, dir string, timeout time.Duration) (wire.BackupAudit, []wire.BackupFile, error) {
	c, err := client.New(nc, client.WithTimeout(timeout))
	if err != nil {
		return wire.BackupAudit{}, nil, err
	}
	defer func() { _ = c.Close() }()
	reply, err := c.BackupAudit(ctx, filepath.Join(dir, auditDir))
	if err != nil {
		return wire.BackupAudit{}, nil, err
	}
	files := make([]wire.BackupFile, 0, len(reply.Files)+1)
	for _, f := range reply.Files {
		files = append(files, wire.BackupFile{Path: path.Join(auditDir, f.Path), Size: f.Size, SHA256: f.SHA256})
	}
	list, err := hashFile(dir, path.Join(auditDir, wire.AuditBackupManifest))
	if err != nil {
		return wire.BackupAudit{}, nil, err
	}
	files = append(files, list)
	return wire.BackupAudit{Time: reply.Time, Dir: auditDir}, files, nil
}

// writeFile creates the file rel under dir, lets write fill it and syncs
// it, returning its size and SHA-256.
func writeFile(dir, rel string, write func(io.Writer) error) (wire.BackupFile, error) {
	f, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(rel)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return wire.BackupFile{}, fmt.Errorf("create %s: %w", rel, err)
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	bw := bufio.NewWriterSize(cw, 256<<10)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return wire.BackupFile{}, fmt.Errorf("write %s: %w", rel, err)
	}
	return wire.BackupFile{Path: rel, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// countWriter counts what passes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// hashFile returns the size and SHA-256 of the file rel under dir.
func hashFile(dir, rel string) (wire.BackupFile, error) {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		return wire.BackupFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return wire.BackupFile{}, fmt.Errorf("read %s: %w", rel, err)
	}
	return wire.BackupFile{Path: rel, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// writeManifest writes m into dir through a temporary file and a rename,
// so that a manifest is either whole or absent.
func writeManifest(dir string, m wire.BackupManifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	tmp := filepath.Join(dir, wire.BackupManifestFile+".tmp")
	if _, err := writeFile(dir, wire.BackupManifestFile+".tmp", func(w io.Writer) error {
		_, err := w.Write(append(data, '\n'))
		return err
	}); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, wire.BackupManifestFile)); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// checkEmpty refuses a directory that exists and holds anything; what
// names it in the error.
func checkEmpty(dir, what string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%w: %s %s: %v", ErrInvalid, what, dir, err)
	case len(entries) > 0:
		return fmt.Errorf("%w: %s %s is not empty: name a new or empty directory", ErrInvalid, what, dir)
	}
	return nil
}

// removeContents empties dir, which held nothing before this package wrote
// into it.
func removeContents(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// gantryVersion is the version of the running gantry, as the build
// recorded it.
func gantryVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(unknown)"
}
