package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/auditd"
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/check"
)

func TestAuditThroughAuditd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, ctx := b.c, ctx(t, 60*time.Second)

	if _, err := c.QueryAudit(ctx, client.AuditQuery{}); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("QueryAudit without auditd = %v, want ErrUnavailable", err)
	}
	svc, err := auditd.New(auditd.Config{Dir: filepath.Join(t.TempDir(), "audit"), Logger: b.env.Log}, b.env.NC)
	if err != nil {
		t.Fatal(err)
	}
	run(t, svc)

	// Submit emits TASK_CREATED; two tasks, one of them on a resource.
	for _, task := range []client.Task{{Type: "noop", ID: "a-1"}, {Type: "noop", ID: "a-2", Resource: "cam1"}} {
		if _, err := c.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	var page client.AuditPage
	check.That(t, 20*time.Second, "both TASK_CREATED stored", func() bool {
		page, err = c.QueryAudit(ctx, client.AuditQuery{Type: wire.EventTaskCreated})
		return err == nil && len(page.Events) == 2
	})
	if page.Events[0].TaskID != "a-1" || page.Events[0].Component != client.DefaultComponent {
		t.Errorf("first event = %s by %s, want a-1 by %s", page.Events[0].TaskID, page.Events[0].Component, client.DefaultComponent)
	}
	if page, err = c.QueryAudit(ctx, client.AuditQuery{ResourceID: "cam1"}); err != nil || len(page.Events) != 1 || page.Events[0].TaskID != "a-2" {
		t.Errorf("QueryAudit(cam1) = %d events, %v; want a-2's", len(page.Events), err)
	}
	var se *client.ServiceError
	if _, err := c.QueryAudit(ctx, client.AuditQuery{Cursor: "%%%"}); !errors.Is(err, client.ErrInvalid) || !errors.As(err, &se) || se.Code != "400" {
		t.Errorf("QueryAudit with a bad cursor = %v, want a 400 matching ErrInvalid", err)
	}
	check.That(t, 20*time.Second, "stats counting the events", func() bool {
		st, err := c.AuditStats(ctx)
		return err == nil && st.Stored >= 2
	})

	dir := filepath.Join(t.TempDir(), "backup")
	bk, err := c.BackupAudit(ctx, dir)
	if err != nil || len(bk.Files) == 0 {
		t.Fatalf("BackupAudit = %d files, %v; want the store's files", len(bk.Files), err)
	}
	if _, err := os.Stat(filepath.Join(dir, wire.AuditBackupManifest)); err != nil {
		t.Errorf("manifest: %v", err)
	}
	st, err := auditd.OpenStore(dir, auditd.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got, err := st.Query(client.AuditQuery{TaskID: "a-2"}); err != nil || len(got.Events) != 1 {
		t.Errorf("backup's events of a-2 = %d, %v; want 1", len(got.Events), err)
	}
	if _, err := c.BackupAudit(ctx, dir); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("BackupAudit into a non-empty dir = %v, want ErrInvalid", err)
	}
}

func TestTailAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.c
	tctx, cancel := context.WithCancel(ctx(t, 30*time.Second))
	defer cancel()

	got := make(chan client.Event, 4)
	malformed := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev, err := range c.TailAudit(tctx, client.AuditQuery{Type: wire.EventTaskCreated, ResourceID: "cam1"}, time.Time{}) {
			if errors.Is(err, client.ErrMalformedEvent) {
				malformed <- err
				continue
			}
			if err != nil {
				t.Errorf("tail = %v, want events", err)
				return
			}
			got <- ev
		}
	}()
	// The tail starts from now: poll-publish until it sees one, then check
	// the filters on more.
	check.That(t, 20*time.Second, "the tail following", func() bool {
		if _, err := c.Submit(tctx, client.Task{Type: "noop", Resource: "cam1"}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
	for len(got) > 0 {
		<-got
	}
	if _, err := c.Submit(tctx, client.Task{Type: "noop", ID: "other"}); err != nil {
		t.Fatal(err)
	}
	if err := b.env.NC.Publish(wire.EventTaskCreated.Subject(), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(tctx, client.Task{Type: "noop", ID: "mine", Resource: "cam1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-malformed:
		if err == nil {
			t.Error("malformed message = nil error, want ErrMalformedEvent")
		}
	case <-tctx.Done():
		t.Fatal("malformed message = not reported, want ErrMalformedEvent")
	}
	select {
	case ev := <-got:
		if ev.TaskID != "mine" || ev.ResourceID != "cam1" {
			t.Errorf("tailed event = %s on %s, want mine on cam1 (other filtered out)", ev.TaskID, ev.ResourceID)
		}
	case <-tctx.Done():
		t.Fatal("tail = nothing, want mine's TASK_CREATED")
	}
	cancel()
	<-done
}
