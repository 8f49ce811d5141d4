package workers

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gantry-dev/gantry/backup"
	"github.com/gantry-dev/gantry/broker/wire"
)

// runBackup is the built-in backup: a whole-system backup (as 'gantry
// backup') into a new directory under the payload's dir, keeping the
// newest keep there. Run again for the same task (a redelivery, or on a
// system restored from that very backup), it finds its backup and takes
// none.
func (w *Workers) runBackup(ctx context.Context, t *Task) error {
	var p wire.BackupPayload
	if err := decodePayload(t, &p); err != nil {
		return err
	}
	switch {
	case p.Dir == "":
		return permanentf("backup payload: dir is required")
	case !filepath.IsAbs(p.Dir):
		return permanentf("backup payload: dir %q: want an absolute path (it is on the worker's machine)", p.Dir)
	case p.Keep < 0:
		return permanentf("backup payload: keep %d: want 0 (keep every backup) or more", p.Keep)
	}
	r, err := backup.TakeUnder(ctx, w.nc, p.Dir, p.Keep, backup.Config{NoAudit: p.NoAudit, TaskID: t.ID})
	if errors.Is(err, backup.ErrInvalid) {
		return Permanent(err)
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	out := fmt.Sprintf("backup %s: %d streams", r.Dir, len(r.Manifest.Streams))
	if r.Manifest.Audit != nil {
		out += " and the audit store"
	}
	if r.Again {
		out += " (taken before by this task)"
	}
	if len(r.Removed) > 0 {
		out += fmt.Sprintf("; removed %d older", len(r.Removed))
	}
	t.SetOutput(out)
	return nil
}
