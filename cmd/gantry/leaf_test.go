package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
)

// TestLeafOffline runs a desktop ('gantry run --leaf') attached to a hub
// with a central auditd. With the hub stopped, the desktop keeps taking and
// running its tasks; once the hub is back, every event of the desktop is
// in the central audit store, once each (the hub's GANTRY_AUDIT sources
// the desktop's across the leaf link).
func TestLeafOffline(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stops and restarts a hub")
	}
	ports := brokertest.FreePorts(t, 3)
	hubURL, leafURL, deskURL := "nats://"+addr(ports[0]), "nats-leaf://press:pw-leaf@"+addr(ports[1]), "nats://"+addr(ports[2])
	// The hub authenticates: the desktop attaches as a user of the role
	// leaf, the central auditd runs as auditd.
	hubCfg := filepath.Join(t.TempDir(), "hub.yaml")
	doc := "auth:\n  users:\n    - {user: op, password: pw-op}\n    - {user: auditd, password: pw-auditd, role: auditd}\n    - {user: press, password: pw-leaf, role: leaf}\n"
	if err := os.WriteFile(hubCfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	hubArgs := []string{"broker", "--config", hubCfg, "--name", "hub", "--data", t.TempDir(), "--nats-listen", addr(ports[0]), "--http-listen", "",
		"--leaf-listen", addr(ports[1]), "--leaf-domains", "desk"}
	hub := spawn(t, "hub", hubArgs...)
	hub.waitReady(t, 30*time.Second)
	central := spawn(t, "central-auditd", "--server", hubURL, "--user", "auditd", "--password", "pw-auditd", "auditd", "--data", t.TempDir())
	central.waitReady(t, 30*time.Second)
	desk := spawn(t, "desk", "run", "--name", "desk", "--leaf", leafURL, "--domain", "desk", "--data", t.TempDir(),
		"--nats-listen", addr(ports[2]), "--http-listen", "")
	desk.waitReady(t, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dc, err := client.Connect(ctx, client.Options{Servers: deskURL})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	run := func(n int) {
		t.Helper()
		for i := range n {
			sub, err := dc.Submit(ctx, client.Task{Type: "noop"})
			if err != nil {
				t.Fatalf("submit %d to the desktop: %v", i, err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			rec, err := dc.Wait(wctx, sub.ID)
			wcancel()
			if err != nil || rec.State != client.TaskSucceeded {
				t.Fatalf("desktop task %s = %s, %v; want SUCCEEDED", sub.ID, rec.State, err)
			}
		}
	}
	run(2)

	// The link is cut: the desktop still takes and runs its tasks.
	hub.stop(t)
	run(5)

	// The hub returns: the desktop's events reach the central store.
	hub = spawn(t, "hub'", hubArgs...)
	hub.waitReady(t, 30*time.Second)
	hc, err := client.Connect(ctx, client.Options{Servers: hubURL, User: "op", Password: "pw-op"})
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	deskJS, err := jetstream.New(dc.Conn())
	if err != nil {
		t.Fatal(err)
	}
	local := streamEventIDs(t, ctx, deskJS)
	poll.For(t, 60*time.Second, 50*time.Millisecond, func() error {
		stored, err := storedEventIDs(ctx, hc)
		if err != nil {
			return err
		}
		missing := 0
		for id := range local {
			if !stored[id] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of the desktop's %d events are not in the central audit store", missing, len(local))
		}
		return nil
	})
	hubJS, err := jetstream.New(hc.Conn())
	if err != nil {
		t.Fatal(err)
	}
	counts := streamEventCounts(t, ctx, hubJS)
	for id := range local {
		if counts[id] != 1 {
			t.Errorf("desktop event %s is %d times in the hub's GANTRY_AUDIT, want once", id, counts[id])
		}
	}
	finished := 0
	page, err := hc.QueryAudit(ctx, client.AuditQuery{Type: wire.EventTaskFinished, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range page.Events {
		if strings.HasPrefix(ev.Component, "workers") {
			finished++
		}
	}
	if finished != 7 {
		t.Errorf("central store holds %d TASK_FINISHED events of the desktop's workers, want 7", finished)
	}
	for _, p := range []*proc{hub, desk, central} {
		if v := p.logged("Violation"); len(v) > 0 {
			t.Errorf("%s: permissions violations: %v", p.name, v)
		}
		if secret := p.logged("pw-leaf"); len(secret) > 0 {
			t.Errorf("%s logged the leaf link's password: %v", p.name, secret)
		}
	}
	central.stop(t)
	desk.stop(t)
}

// TestComponentsReconnect runs each component as its own process against a
// broker that is stopped and started again: while it is down every
// component's /readyz fails and its log says it is disconnected; once it
// is back they reconnect, say so, are ready again, and the work goes on.
func TestComponentsReconnect(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stops and restarts a broker")
	}
	port := brokertest.FreePorts(t, 1)[0]
	url := "nats://" + addr(port)
	brokerArgs := []string{"broker", "--data", t.TempDir(), "--nats-listen", addr(port), "--http-listen", ""}
	brk := spawn(t, "broker", brokerArgs...)
	brk.waitReady(t, 30*time.Second)
	var comps []*proc
	var readyz []string
	for _, c := range [][]string{{"worker"}, {"scheduler"}, {"healthd"}, {"auditd", "--data", t.TempDir()}} {
		p := spawn(t, c[0], append([]string{"--server", url}, append(c, "--http-listen", "127.0.0.1:0")...)...)
		comps = append(comps, p)
		readyz = append(readyz, p.waitReady(t, 30*time.Second).HTTP+"/readyz")
	}
	status := func(u string) int {
		resp, err := http.Get(u)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	allStatus := func(want int) func() error {
		return func() error {
			for i, u := range readyz {
				if got := status(u); got != want {
					return fmt.Errorf("%s /readyz = %d, want %d", comps[i].name, got, want)
				}
			}
			return nil
		}
	}
	poll.For(t, 10*time.Second, 50*time.Millisecond, allStatus(http.StatusOK))

	brk.stop(t)
	poll.For(t, 10*time.Second, 50*time.Millisecond, allStatus(http.StatusServiceUnavailable))
	for _, p := range comps {
		if len(p.logged("broker connection lost")) == 0 {
			t.Errorf("%s did not log its disconnect", p.name)
		}
	}

	brk = spawn(t, "broker'", brokerArgs...)
	brk.waitReady(t, 30*time.Second)
	poll.For(t, 20*time.Second, 50*time.Millisecond, allStatus(http.StatusOK))
	for _, p := range comps {
		if len(p.logged("broker connection back")) == 0 {
			t.Errorf("%s did not log its reconnect", p.name)
		}
	}
	code, _, stderr := runInProcess(t, "--server", url, "submit", "noop", "--wait", "--wait-timeout", "20s")
	if code != exitOK {
		t.Errorf("submit --wait after the broker's restart = exit %d, stderr %q", code, stderr)
	}
	for _, p := range comps {
		p.stop(t)
	}
}
