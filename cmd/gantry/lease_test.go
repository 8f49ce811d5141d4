package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

// leaseCLI runs a client command against url in this process.
func leaseCLI(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	return runInProcess(t, append([]string{"--server", url}, args...)...)
}

func TestLeaseCLI(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	u := env.URL
	if code, out, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "alice", "--ttl", "30s", "--json"); code != exitOK || !strings.Contains(out, `"owner": "alice"`) {
		t.Fatalf("acquire = %d %q %q, want 0 and alice's lease", code, out, errs)
	}
	// The CLI waits for its audit events before it exits.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	audit, err := env.JS.Stream(ctx, wire.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := audit.GetLastMsgForSubject(ctx, wire.EventResourceLeased.Subject()); err != nil {
		t.Errorf("RESOURCE_LEASED after lease acquire: %v", err)
	}
	for _, args := range [][]string{
		{"lease", "acquire", "cam1", "--owner", "bob"},
		{"lease", "renew", "cam1", "--owner", "bob"},
		{"lease", "release", "cam1", "--owner", "bob"},
	} {
		code, _, errs := leaseCLI(t, u, args...)
		if code != exitConflict || !strings.Contains(errs, "held by alice until") {
			t.Errorf("%v = exit %d, stderr %q; want 3 naming alice and the expiry", args, code, errs)
		}
	}
	code, out, _ := leaseCLI(t, u, "lease", "ls", "--json")
	var ls []map[string]any
	if err := json.Unmarshal([]byte(out), &ls); err != nil || code != exitOK {
		t.Fatalf("ls --json = %d %q: %v", code, out, err)
	}
	if len(ls) != 1 || ls[0]["resource"] != "cam1" || ls[0]["owner"] != "alice" || ls[0]["expires_at"] == nil || ls[0]["revision"] == nil {
		t.Errorf("ls --json = %v, want alice's lease on cam1 with expires_at and revision", ls)
	}
	if code, _, errs := leaseCLI(t, u, "lease", "renew", "cam1", "--owner", "alice", "--ttl", "1m"); code != exitOK {
		t.Errorf("renew by alice = %d %q, want 0", code, errs)
	}
	if code, _, errs := leaseCLI(t, u, "lease", "release", "cam1", "--owner", "alice"); code != exitOK {
		t.Errorf("release by alice = %d %q, want 0", code, errs)
	}
	for _, args := range [][]string{
		{"lease", "release", "cam1", "--owner", "alice"},
		{"lease", "renew", "cam1", "--owner", "alice"},
	} {
		if code, _, errs := leaseCLI(t, u, args...); code != exitNotFound || !strings.Contains(errs, "no lease on cam1") {
			t.Errorf("%v with no lease = exit %d %q, want 4 saying there is no lease on cam1", args, code, errs)
		}
	}
	for _, args := range [][]string{
		{"lease", "acquire", "cam1"},
		{"lease", "renew", "cam1"},
		{"lease", "release", "cam1"},
	} {
		if code, _, errs := leaseCLI(t, u, args...); code != exitUsage || !strings.Contains(errs, "--owner is required") {
			t.Errorf("%v = exit %d %q, want 2 asking for --owner", args, code, errs)
		}
	}
	for _, args := range [][]string{
		{"lease", "acquire", "cam.1", "--owner", "a"},
		{"lease", "acquire", "cam1", "--owner", "a", "--ttl", "-1s"},
		{"lease", "run", "cam1"},
		{"lease", "run", "cam1", "echo"},
	} {
		if code, _, errs := leaseCLI(t, u, args...); code != exitUsage {
			t.Errorf("%v = exit %d %q, want 2", args, code, errs)
		}
	}
}

func TestResourceCLI(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	u := env.URL
	if code, _, errs := leaseCLI(t, u, "resource", "add", "cam1", "--route", "office", "--force"); code != exitOK {
		t.Fatalf("add = %d %q", code, errs)
	}
	code, out, _ := leaseCLI(t, u, "resource", "ls", "--json")
	var rs []map[string]any
	if err := json.Unmarshal([]byte(out), &rs); err != nil || code != exitOK {
		t.Fatalf("ls --json = %d %q: %v", code, out, err)
	}
	if len(rs) != 1 {
		t.Fatalf("ls --json = %v, want one resource", rs)
	}
	for _, k := range []string{"id", "state", "lease_owner", "lease_until", "route_id", "last_error", "updated_at"} {
		if _, ok := rs[0][k]; !ok {
			t.Errorf("resource JSON %v lacks %q", rs[0], k)
		}
	}
	if rs[0]["state"] != "AVAILABLE" || rs[0]["route_id"] != "office" {
		t.Errorf("resource = %v, want AVAILABLE on route office", rs[0])
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"resource", "set-state", "cam1", "RUNNING", "--reason", "x"}, exitUsage, "AVAILABLE -> RUNNING"},
		{[]string{"resource", "set-state", "cam1", "COOLDOWN", "--reason", "x"}, exitUsage, "AVAILABLE -> COOLDOWN"},
		{[]string{"resource", "set-state", "cam1", "FAULT", "--reason", "x"}, exitUsage, "AVAILABLE -> FAULT"},
		{[]string{"resource", "set-state", "cam1", "BROKEN", "--reason", "x"}, exitUsage, "unknown resource state"},
		{[]string{"resource", "set-state", "cam1", "DISABLED"}, exitUsage, "--reason is required"},
		{[]string{"resource", "set-state", "nope", "DISABLED", "--reason", "x"}, exitNotFound, "not found"},
		{[]string{"resource", "get", "nope"}, exitNotFound, "not found"},
		{[]string{"resource", "enable", "nope"}, exitNotFound, "not found"},
		{[]string{"resource", "add", "cam1", "--reclaim", "later"}, exitUsage, "want available or fault"},
	} {
		code, _, errs := leaseCLI(t, u, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v = exit %d, stderr %q; want %d mentioning %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	if code, _, errs := leaseCLI(t, u, "resource", "disable", "cam1", "--reason", "maintenance"); code != exitOK {
		t.Fatalf("disable = %d %q", code, errs)
	}
	if code, _, errs := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "a"); code != exitFailure || !strings.Contains(errs, "DISABLED") {
		t.Errorf("acquire of a DISABLED resource = %d %q, want 1 saying DISABLED", code, errs)
	}
	if code, _, errs := leaseCLI(t, u, "resource", "set-state", "cam1", "FAULT", "--reason", "x"); code != exitUsage || !strings.Contains(errs, "DISABLED -> FAULT") {
		t.Errorf("DISABLED -> FAULT = %d %q, want 2 naming both", code, errs)
	}
	if code, out, errs := leaseCLI(t, u, "resource", "enable", "cam1", "--json"); code != exitOK || !strings.Contains(out, `"state": "AVAILABLE"`) {
		t.Errorf("enable = %d %q %q, want AVAILABLE", code, out, errs)
	}
	if code, out, _ := leaseCLI(t, u, "lease", "acquire", "cam1", "--owner", "a"); code != exitOK {
		t.Fatalf("acquire = %d", code)
	} else if !strings.Contains(out, "cam1") {
		t.Errorf("acquire output %q, want the lease", out)
	}
	if code, out, _ := leaseCLI(t, u, "resource", "get", "cam1", "--json"); code != exitOK || !strings.Contains(out, `"state": "LEASED"`) || !strings.Contains(out, `"lease_owner": "a"`) {
		t.Errorf("get after acquire = %d %q, want LEASED by a", code, out)
	}
	if code, _, _ := leaseCLI(t, u, "lease", "release", "cam1", "--owner", "a"); code != exitOK {
		t.Errorf("release = %d", code)
	}
	if code, out, _ := leaseCLI(t, u, "resource", "get", "cam1", "--json"); code != exitOK || !strings.Contains(out, `"state": "AVAILABLE"`) {
		t.Errorf("get after release = %d %q, want AVAILABLE", code, out)
	}
}

func TestLeaseTwoProcessesOneWinner(t *testing.T) {
	t.Parallel()
	env := brokertest.Start(t)
	// Eight rounds of two racing processes: the lease model test (lease/)
	// covers many more interleavings in-process.
	for round := range 8 {
		var wg sync.WaitGroup
		codes := make([]int, 2)
		outs := make([]string, 2)
		for i := range 2 {
			wg.Go(func() {
				c := gantryCmd(t, "--server", env.URL, "lease", "acquire", "dev", "--owner", []string{"p0", "p1"}[i], "--ttl", "30s")
				out, err := c.CombinedOutput()
				outs[i] = string(out)
				codes[i] = c.ProcessState.ExitCode()
				if err != nil && codes[i] != exitConflict {
					t.Errorf("round %d: process %d: %v %s", round, i, err, out)
				}
			})
		}
		wg.Wait()
		winners := 0
		winner := ""
		for i, c := range codes {
			switch c {
			case exitOK:
				winners++
				winner = []string{"p0", "p1"}[i]
			case exitConflict:
				if !strings.Contains(outs[i], "is held by") {
					t.Errorf("round %d: loser said %q, want the holder named", round, outs[i])
				}
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: exit codes %v, want exactly one 0 and one 3", round, codes)
		}
		if code, _, errs := leaseCLI(t, env.URL, "lease", "release", "dev", "--owner", winner); code != exitOK {
			t.Fatalf("round %d: release by %s = %d %q", round, winner, code, errs)
		}
	}
}

func TestRunRegistersConfigResources(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gantry.yaml")
	if err := os.WriteFile(cfg, []byte("resources:\n  - {id: cam1, reclaim: fault}\n  - {id: printer}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ready := startGantry(t, "run", "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http-listen", "", "--config", cfg)
	code, out, errs := leaseCLI(t, ready.NATS, "resource", "ls", "--json")
	var rs []map[string]any
	if err := json.Unmarshal([]byte(out), &rs); err != nil || code != exitOK {
		t.Fatalf("resource ls = %d %q %q: %v", code, out, errs, err)
	}
	if len(rs) != 2 || rs[0]["id"] != "cam1" || rs[0]["reclaim"] != "fault" || rs[1]["id"] != "printer" || rs[1]["state"] != string(wire.ResourceAvailable) {
		t.Errorf("resources = %v, want cam1 (reclaim fault) and printer, AVAILABLE", rs)
	}
}
