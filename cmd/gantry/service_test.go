package main

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func testServiceSpec(t *testing.T) serviceSpec {
	t.Helper()
	exe, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	return serviceSpec{Name: "gantry-test", Exe: exe, Args: []string{"run", "--config", "/etc/gantry/my gantry.yaml", "--data", "/var/lib/gantry"},
		LogFile: filepath.Join(t.TempDir(), "gantry-test.log")}
}

// TestSystemdUnit renders the unit and, where systemd-analyze is
// installed, has systemd verify it.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	s := testServiceSpec(t)
	unit := systemdUnit(s)
	for _, want := range []string{
		`ExecStart=` + s.Exe + ` run --config "/etc/gantry/my gantry.yaml" --data /var/lib/gantry`,
		"Restart=on-failure", "KillSignal=SIGTERM", "TimeoutStopSec=15s", "WantedBy=multi-user.target",
		"StandardError=append:" + s.LogFile,
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %q:\n%s", want, unit)
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is not verified")
	}
	path := filepath.Join(t.TempDir(), "gantry-test.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", path).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze verify: %v: %s\n%s", err, out, unit)
	}
}

func TestLaunchdPlist(t *testing.T) {
	t.Parallel()
	s := testServiceSpec(t)
	plist := launchdPlist(s)
	var doc struct {
		Dict struct {
			Keys    []string `xml:"key"`
			Strings []string `xml:"string"`
			Array   struct {
				Strings []string `xml:"string"`
			} `xml:"array"`
		} `xml:"dict"`
	}
	if err := xml.Unmarshal([]byte(plist), &doc); err != nil {
		t.Fatalf("plist is not XML: %v\n%s", err, plist)
	}
	if got, want := doc.Dict.Array.Strings, append([]string{s.Exe}, s.Args...); !slices.Equal(got, want) {
		t.Errorf("ProgramArguments = %q, want %q", got, want)
	}
	for _, k := range []string{"Label", "RunAtLoad", "KeepAlive", "ExitTimeOut", "StandardErrorPath"} {
		if !slices.Contains(doc.Dict.Keys, k) {
			t.Errorf("plist keys = %v, want %s among them", doc.Dict.Keys, k)
		}
	}
	if !slices.Contains(doc.Dict.Strings, "dev.gantry.gantry-test") {
		t.Errorf("plist strings = %v, want the label dev.gantry.gantry-test", doc.Dict.Strings)
	}
}

// TestWindowsService checks what 'gantry service install' gives the
// Windows Service Control Manager: the service runs 'gantry service run'
// with the log file and the gantry arguments, starts at boot, restarts
// after failures.
func TestWindowsService(t *testing.T) {
	t.Parallel()
	s := testServiceSpec(t)
	ws := windowsServiceOf(s)
	wantArgs := append([]string{"service", "run", "--name", "gantry-test", "--log-file", s.LogFile, "--"}, s.Args...)
	if ws.Name != "gantry-test" || ws.Exe != s.Exe || !slices.Equal(ws.Args, wantArgs) {
		t.Errorf("windows service = %s %s %q, want gantry-test %s %q", ws.Name, ws.Exe, ws.Args, s.Exe, wantArgs)
	}
	if !ws.StartAutomatic || len(ws.RestartDelays) == 0 || ws.RestartDelays[0] != 5*time.Second {
		t.Errorf("windows service start automatic %v, restarts %v; want automatic, restart after 5s first", ws.StartAutomatic, ws.RestartDelays)
	}
	if !strings.Contains(ws.Description, "gantry run --config") {
		t.Errorf("description = %q, want the command it runs", ws.Description)
	}
	// The service's own command line parses: 'service run' takes it.
	code, _, stderr := runInProcess(t, append(slices.Clone(ws.Args[:len(ws.Args)-len(s.Args)]), "version")...)
	if code != exitOK {
		t.Errorf("gantry %v version = exit %d, stderr %q", ws.Args[:6], code, stderr)
	}
	data, err := os.ReadFile(s.LogFile)
	if err != nil || !strings.Contains(string(data), "gantry") {
		t.Errorf("log file %s = %q, want the version output", s.LogFile, data)
	}
}

func TestServiceInstallDryRun(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("prints a systemd unit on Linux only")
	}
	code, stdout, stderr := runInProcess(t, "service", "install", "--dry-run", "--name", "gw", "--", "worker", "--server", "nats://hub:4222")
	if code != exitOK || !strings.Contains(stdout, "ExecStart=") || !strings.Contains(stdout, " worker --server nats://hub:4222") {
		t.Errorf("service install --dry-run = exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, _, stderr = runInProcess(t, "service", "install", "--dry-run", "--name", "bad name")
	if code != exitUsage {
		t.Errorf("service install --name 'bad name' = exit %d, stderr %q; want 2", code, stderr)
	}
}
