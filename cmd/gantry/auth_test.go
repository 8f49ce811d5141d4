package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/internal/brokertest"
	poll "github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/config"
)

// roleUsers are the users of the secured broker: one per role, each named
// after its role, with the password pw-<role>.
var roleUsers = []string{"operator", "worker", "scheduler", "healthd", "auditd", "alertd", "submitter", "viewer"}

// securedBroker starts 'gantry broker' with a user per role (and a viewer
// with an NKey, whose seed file it returns) and returns it and its URL.
func securedBroker(t *testing.T, extra string) (*proc, string, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	dir := t.TempDir()
	seedFile := filepath.Join(dir, "viewer.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("auth:\n  users:\n")
	for _, r := range roleUsers {
		fmt.Fprintf(&b, "    - {user: %s, password: pw-%s, role: %s}\n", r, r, r)
	}
	fmt.Fprintf(&b, "    - {nkey: %s, role: viewer}\n", pub)
	b.WriteString(extra)
	cfg := filepath.Join(dir, "gantry.yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	p := spawn(t, "broker", "broker", "--config", cfg, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	return p, p.waitReady(t, 30*time.Second).NATS, seedFile
}

// as returns the client flags of the user of role.
func as(url, role string) []string {
	return []string{"--server", url, "--user", role, "--password", "pw-" + role}
}

// TestRolesMatchConfig keeps the config file's list of roles and the
// broker's the same.
func TestRolesMatchConfig(t *testing.T) {
	t.Parallel()
	var want []string
	for _, r := range broker.Roles {
		want = append(want, string(r))
	}
	if !slices.Equal(config.Roles, want) {
		t.Errorf("config.Roles = %v, want %v", config.Roles, want)
	}
}

// TestRolesRunComponents runs each component as a separate process under
// its own role, with tasks submitted by a submitter and read by a viewer:
// everything works, and the broker refuses nothing.
func TestRolesRunComponents(t *testing.T) {
	t.Parallel()
	probe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer probe.Close()
	brk, url, seed := securedBroker(t, "")
	cfg := filepath.Join(t.TempDir(), "gantry.yaml")
	doc := fmt.Sprintf("routes:\n  - {id: r1, proxy: direct, probe_url: %[1]q, interval: 1s}\njobs:\n  - {name: tick, type: noop, every: 1s}\n"+
		"alerts:\n  check_interval: 1s\n  rules:\n    - {name: review, kind: needs_review}\n    - {name: slow, kind: long_running, after: 1h}\n"+
		"    - {name: routes, kind: route_down}\n    - {name: devices, kind: resource_fault}\n    - {name: leader, kind: leader_lost}\n"+
		"    - {name: audit, kind: audit_lag, max_pending: 10000}\n  webhooks:\n    - {name: hook, url: %[1]q}\n", probe.URL)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var comps []*proc
	for _, c := range [][]string{
		{"worker", "--http-listen", "127.0.0.1:0"},
		{"scheduler", "--config", cfg},
		{"healthd", "--config", cfg},
		{"auditd", "--data", t.TempDir()},
		{"alertd", "--config", cfg},
	} {
		p := spawn(t, c[0], append(as(url, c[0]), c...)...)
		comps = append(comps, p)
	}
	for _, p := range comps {
		p.waitReady(t, 30*time.Second)
	}
	mustRun := func(role string, args ...string) string {
		t.Helper()
		code, stdout, stderr := runInProcess(t, append(as(url, role), args...)...)
		if code != exitOK {
			t.Fatalf("%s: gantry %v = exit %d, stderr %q", role, args, code, stderr)
		}
		return stdout
	}
	mustRun("operator", "resource", "add", "cam1")
	mustRun("submitter", "submit", "noop", "--publish-only", "--wait", "--wait-timeout", "20s")
	mustRun("submitter", "submit", "exec", "--publish-only", "--resource", "cam1", "--key", "k1",
		"--payload", `{"cmd":["true"]}`, "--wait", "--wait-timeout", "20s")
	mustRun("operator", "job", "trigger", "tick")
	mustRun("operator", "route", "probe", "r1")
	for _, args := range [][]string{
		{"task", "ls"}, {"lease", "ls"}, {"resource", "ls"}, {"job", "ls"}, {"route", "ls"}, {"job", "runs", "tick"},
		{"audit", "query", "--type", "TASK_FINISHED"},
	} {
		mustRun("viewer", args...)
	}
	if code, _, stderr := runInProcess(t, "--server", url, "--nkey", seed, "task", "ls"); code != exitOK {
		t.Errorf("task ls as an nkey viewer = exit %d, stderr %q", code, stderr)
	}
	poll.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		out := mustRun("viewer", "audit", "query", "--type", "JOB_FIRED", "--json")
		if !strings.Contains(out, "tick") {
			return errors.New("no JOB_FIRED event of tick in the audit store")
		}
		return nil
	})
	for _, p := range append(comps, brk) {
		if v := append(p.logged("Violation"), p.logged("broker refused")...); len(v) > 0 {
			t.Errorf("%s: the broker refused a component its role's subjects: %v", p.name, v)
		}
		if secret := p.logged("pw-"); len(secret) > 0 {
			t.Errorf("%s logged a password: %v", p.name, secret)
		}
	}
	for _, p := range comps {
		p.stop(t)
	}
}

// TestRoleAbusesRefused tries what a viewer, a submitter and a worker must
// not do: each is refused by the broker, and the CLI exits 1 naming the
// subject.
func TestRoleAbusesRefused(t *testing.T) {
	t.Parallel()
	_, url, _ := securedBroker(t, "")
	code, stdout, stderr := runInProcess(t, append(as(url, "operator"), "submit", "noop")...)
	if code != exitOK {
		t.Fatalf("submit as operator = exit %d, stderr %q", code, stderr)
	}
	id := strings.TrimSpace(stdout)
	if code, _, stderr := runInProcess(t, append(as(url, "operator"), "resource", "add", "cam1")...); code != exitOK {
		t.Fatalf("resource add = exit %d, stderr %q", code, stderr)
	}

	for _, tc := range []struct {
		role    string
		args    []string
		subject string
	}{
		{"viewer", []string{"lease", "acquire", "cam1", "--owner", "me", "--ttl", "1h"}, "$KV.gantry_leases.cam1"},
		{"viewer", []string{"resource", "set-state", "cam1", "DISABLED", "--reason", "mine"}, "$KV.gantry_resources.cam1"},
		{"viewer", []string{"task", "cancel", id}, "$KV.gantry_tasks." + id},
		{"submitter", []string{"task", "cancel", id}, "$KV.gantry_tasks." + id},
		{"submitter", []string{"submit", "noop"}, "$KV.gantry_tasks."},
		{"worker", []string{"job", "add", "evil", "--type", "noop", "--every", "1m"}, "gantry_jobs"},
	} {
		t.Run(tc.role+" "+strings.Join(tc.args[:2], " "), func(t *testing.T) {
			code, _, stderr := runInProcess(t, append(as(url, tc.role), tc.args...)...)
			if code != exitFailure || !strings.Contains(stderr, "permission denied") || !strings.Contains(stderr, tc.subject) {
				t.Errorf("gantry %v as %s = exit %d, stderr %q; want exit 1, permission denied naming %s", tc.args, tc.role, code, stderr, tc.subject)
			}
		})
	}

	for _, tc := range []struct {
		role, subject string
	}{
		{"viewer", "$KV.gantry_leases.cam1"},
		{"viewer", "$KV.gantry_routes.evil"},
		{"viewer", "gantry.audit.task.finished"},
		{"viewer", "$JS.API.STREAM.PURGE.GANTRY_AUDIT"},
		{"viewer", "$JS.API.STREAM.DELETE.GANTRY_TASKS"},
		{"submitter", "$KV.gantry_leases.cam1"},
		{"submitter", "$KV.gantry_routes.evil"},
		{"submitter", "$KV.gantry_tasks.evil"},
		{"submitter", "gantry.audit.task.finished"},
		{"submitter", "gantry.control.task.cancel"},
		{"submitter", "$JS.API.STREAM.MSG.DELETE.GANTRY_TASKS"},
		{"submitter", "$JS.API.STREAM.PURGE.GANTRY_AUDIT"},
		{"submitter", "$JS.API.STREAM.DELETE.GANTRY_TASKS"},
		{"worker", "gantry.audit.job.fired"},
		{"worker", "$KV.gantry_jobs.evil"},
		{"worker", "$KV.gantry_routes.evil"},
		{"worker", "$JS.API.STREAM.DELETE.GANTRY_TASKS"},
		{"worker", "$JS.API.STREAM.PURGE.GANTRY_AUDIT"},
		{"scheduler", "gantry.audit.task.finished"},
		{"healthd", "gantry.tasks.default.exec"},
	} {
		t.Run(tc.role+" publish "+tc.subject, func(t *testing.T) {
			refused(t, url, tc.role, tc.subject)
		})
	}
}

// refused publishes on subject as role's user and waits for the broker's
// permission error naming it.
func refused(t *testing.T, url, role, subject string) {
	t.Helper()
	errs := make(chan error, 4)
	nc, err := nats.Connect(url, nats.UserInfo(role, "pw-"+role),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish(subject, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Errorf("publish %s as %s: error %v, want a permissions violation naming it", subject, role, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("publish %s as %s: no permissions violation within 5s", subject, role)
	}
}

// TestInsecureListenersRefused: HTTP, routes and leaf links beyond
// loopback without authentication (or route TLS) are refused, exit 2.
func TestInsecureListenersRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--http-listen", "0.0.0.0:0"}, "--http-listen"},
		{[]string{"broker", "--http-listen", "0.0.0.0:0"}, "--http-listen"},
		{[]string{"broker", "--cluster", "0.0.0.0:0", "--routes", "nats-route://127.0.0.1:1"}, "tls.cluster"},
		{[]string{"broker", "--leaf-listen", "0.0.0.0:0"}, "leaf listen"},
		{[]string{"worker", "--http-listen", "0.0.0.0:0", "--server", "nats://127.0.0.1:1"}, "--http-listen"},
		{[]string{"broker", "--routes", "nats-route://127.0.0.1:1"}, "--cluster"},
	} {
		args := append(tc.args, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--log-format", "json")
		if tc.args[0] == "worker" {
			args = append(tc.args, "--log-format", "json")
		}
		code, _, stderr := runInProcess(t, args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("gantry %v = exit %d, stderr %q; want exit 2 mentioning %s", tc.args, code, stderr, tc.want)
		}
	}
}

// TestOperatorCreds runs the broker in operator mode: users are creds files
// minted with 'gantry role creds'; a worker runs under its creds, an
// operator's task runs, a viewer reads, and the worker's creds cannot
// write gantry_jobs.
func TestOperatorCreds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	op, acc, seed, sys := brokertest.OperatorFiles(t, dir)
	cfg := filepath.Join(dir, "gantry.yaml")
	doc := fmt.Sprintf("auth:\n  operator: {jwt: %q, account: %q, account_seed: %q, system_account: %q}\n", op, acc, seed, sys)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	brk := spawn(t, "broker", "broker", "--config", cfg, "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "")
	url := brk.waitReady(t, 30*time.Second).NATS
	creds := map[string]string{}
	for _, r := range []string{"operator", "worker", "viewer"} {
		creds[r] = filepath.Join(dir, r+".creds")
		if code, _, stderr := runInProcess(t, "role", "creds", r, "--name", "test-"+r, "--account-seed", seed, "--out", creds[r]); code != exitOK {
			t.Fatalf("role creds %s = exit %d, stderr %q", r, code, stderr)
		}
	}
	worker := spawn(t, "worker", "--server", url, "--creds", creds["worker"], "worker")
	worker.waitReady(t, 30*time.Second)
	if code, _, stderr := runInProcess(t, "--server", url, "--creds", creds["operator"], "submit", "noop", "--wait", "--wait-timeout", "20s"); code != exitOK {
		t.Errorf("submit --wait as the operator = exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runInProcess(t, "--server", url, "--creds", creds["viewer"], "task", "ls"); code != exitOK {
		t.Errorf("task ls as a viewer = exit %d, stderr %q", code, stderr)
	}
	code, _, stderr := runInProcess(t, "--server", url, "--creds", creds["worker"], "job", "add", "evil", "--type", "noop", "--every", "1m")
	if code != exitFailure || !strings.Contains(stderr, "permission denied") || !strings.Contains(stderr, "gantry_jobs") {
		t.Errorf("job add with worker creds = exit %d, stderr %q; want exit 1, permission denied naming gantry_jobs", code, stderr)
	}
	if v := append(worker.logged("Violation"), worker.logged("broker refused")...); len(v) > 0 {
		t.Errorf("the worker under its creds was refused: %v", v)
	}
	worker.stop(t)
}
