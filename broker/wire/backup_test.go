package wire

import "testing"

func TestBackupGolden(t *testing.T) {
	t.Parallel()
	golden(t, "backup_payload", BackupPayload{Dir: "/backups/gantry", Keep: 7})
	golden(t, "backup_manifest", BackupManifest{
		Format: BackupFormat, GantryVersion: "v1.2.0", ServerVersion: "2.15.2", ServerName: "gantry-4222",
		Started: t0, Finished: t0.Add(3e9), TaskID: "task-1",
		Streams: []BackupStream{{
			Name: StreamTasks, Time: t0, Messages: 12, Bytes: 3456, FirstSeq: 40, LastSeq: 51, Consumers: 1,
			Data: "streams/GANTRY_TASKS/stream.arc.s2", Meta: "streams/GANTRY_TASKS/backup.json",
		}, {
			Name: "KV_" + BucketLeases, Bucket: BucketLeases, Time: t0, Messages: 1, Bytes: 210, FirstSeq: 9, LastSeq: 9,
			Data: "streams/KV_gantry_leases/stream.arc.s2", Meta: "streams/KV_gantry_leases/backup.json",
		}},
		Audit: &BackupAudit{Time: t0.Add(2e9), Dir: "audit"},
		Files: []BackupFile{{Path: "streams/GANTRY_TASKS/stream.arc.s2", Size: 1024, SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}},
	})
}

func TestLeaseRevokedSubject(t *testing.T) {
	t.Parallel()
	if got, want := EventLeaseRevoked.Subject(), "gantry.audit.resource.lease_revoked"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
}
