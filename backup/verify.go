package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-dev/gantry/broker/wire"
)

// CorruptError says what is wrong with a backup: one problem per entry,
// each naming its file. It matches ErrCorrupt.
type CorruptError struct {
	Dir      string
	Problems []string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("backup %s is damaged: %s", e.Dir, strings.Join(e.Problems, "; "))
}

// Unwrap makes a CorruptError match ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Verified is a backup whose files all match its manifest: what Restore
// restores.
type Verified struct {
	// Dir is the backup's directory.
	Dir string
	// Manifest is its manifest.
	Manifest wire.BackupManifest
}

// Verify checks the backup in dir without restoring it: its manifest
// reads, is of a format this gantry knows, and every file it lists is
// there with its size and SHA-256. A missing, truncated or altered file is
// a *CorruptError naming every such file.
func Verify(dir string) (*Verified, error) {
	bad := &CorruptError{Dir: dir}
	data, err := os.ReadFile(filepath.Join(dir, wire.BackupManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		bad.Problems = append(bad.Problems, wire.BackupManifestFile+": missing (not a backup, or one that did not finish)")
		return nil, bad
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m wire.BackupManifest
	if err := json.Unmarshal(data, &m); err != nil {
		bad.Problems = append(bad.Problems, fmt.Sprintf("%s: unreadable: %v", wire.BackupManifestFile, err))
		return nil, bad
	}
	if m.Format != wire.BackupFormat {
		bad.Problems = append(bad.Problems, fmt.Sprintf("%s: format %d, want %d (taken by gantry %s)", wire.BackupManifestFile, m.Format, wire.BackupFormat, m.GantryVersion))
		return nil, bad
	}
	listed := map[string]bool{}
	for _, f := range m.Files {
		listed[f.Path] = true
		if problem := checkFile(dir, f); problem != "" {
			bad.Problems = append(bad.Problems, f.Path+": "+problem)
		}
	}
	for _, s := range m.Streams {
		for _, p := range []string{s.Data, s.Meta} {
			if !listed[p] {
				bad.Problems = append(bad.Problems, fmt.Sprintf("stream %s: file %q is not in the manifest's file list", s.Name, p))
			}
		}
	}
	if len(bad.Problems) > 0 {
		return nil, bad
	}
	for _, s := range m.Streams {
		if _, err := readMeta(dir, s); err != nil {
			bad.Problems = append(bad.Problems, fmt.Sprintf("%s: %v", s.Meta, err))
		}
	}
	if m.Audit != nil && (m.Audit.Dir == "" || !filepath.IsLocal(filepath.FromSlash(m.Audit.Dir))) {
		bad.Problems = append(bad.Problems, fmt.Sprintf("%s: audit dir %q is not inside the backup", wire.BackupManifestFile, m.Audit.Dir))
	}
	if len(bad.Problems) > 0 {
		return nil, bad
	}
	return &Verified{Dir: dir, Manifest: m}, nil
}

// checkFile checks one file against its manifest entry and says what is
// wrong with it, or "".
func checkFile(dir string, f wire.BackupFile) string {
	local := filepath.FromSlash(f.Path)
	if !filepath.IsLocal(local) {
		return "path is not inside the backup"
	}
	r, err := os.Open(filepath.Join(dir, local))
	if errors.Is(err, os.ErrNotExist) {
		return "missing"
	}
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	switch {
	case err != nil:
		return "unreadable: " + err.Error()
	case n < f.Size:
		return fmt.Sprintf("truncated: %d bytes, want %d", n, f.Size)
	case n > f.Size:
		return fmt.Sprintf("%d bytes, want %d", n, f.Size)
	case hex.EncodeToString(h.Sum(nil)) != f.SHA256:
		return "SHA-256 does not match the manifest: the file is corrupted"
	}
	return ""
}

// readMeta reads a stream's meta file: the restore request, whose stream
// must be the one it is filed under.
func readMeta(dir string, s wire.BackupStream) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(s.Meta)))
	if err != nil {
		return nil, err
	}
	var req struct {
		Config struct {
			Name string `json:"name"`
		} `json:"config"`
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("unreadable: %w", err)
	}
	if req.Config.Name != s.Name {
		return nil, fmt.Errorf("holds stream %q, want %q", req.Config.Name, s.Name)
	}
	return data, nil
}
