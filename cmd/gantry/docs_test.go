//go:build !windows

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/internal/proxytest"
)

// The docs test runs every command of the fenced sh and console blocks of
// README.md and every docs/*.md (a page added later is picked up by the
// glob) against a live 'gantry run' it starts for each page, so that no
// example drifts from what gantry does. The gantry on its PATH is this
// test binary run as gantry (the same main); the nats lines run the real
// nats CLI ('make test' installs it into bin/ with 'go install
// github.com/nats-io/natscli/nats@v0.5.0'; without it they are skipped, and
// under CI (CI set) that is a failure).
//
// A console block's "$ " lines are commands and the lines after one are
// its expected output (times and numbers masked), ending in "(exit N)"
// when the command exits N; a sh block's lines are commands expected to
// exit 0, or N when their comment ends in "(exit N)". Remote broker URLs
// and absolute data paths are pointed at the test's own, and a 'gantry run'
// or 'gantry broker' that names no ports gets free ones. Every command runs in a scratch directory holding the files the
// examples name, with NATS_URL set to the live broker.

// docsNotRun are the commands no test can run, with the reason.
var docsNotRun = map[string]string{
	"make run":                            "starts gantry on the default ports for a person; this test starts its own 'gantry run' instead",
	"make test":                           "runs the whole test suite, this test included",
	"make fuzz":                           "runs every fuzz target for FUZZTIME each, minutes of CPU; go test runs their seed corpora",
	"gantry submit sql --db office":       "needs a PostgreSQL or SQL Server database 'office', which this test does not run (cmd/gantry/sql_test.go runs SQLite)",
	"cd examples/handlers/node":           "installs the Node example's modules; TestNodeHandlerExample runs the example",
	"NATS_URL=nats://127.0.0.1:4222 node": "the Node handler example, run by TestNodeHandlerExample",
	"gantry bench":                        "measures for up to minutes with a gantry run of its own; TestBench runs each scenario's short form through the real binary",
}

// docsPaths are the absolute directories the examples write to; the test
// writes under its scratch directory instead.
var docsPaths = regexp.MustCompile(`(\s)/(backups|var/lib|var/backups)/`)

// docsFollow are commands that run until interrupted: each is started in
// the background, must still be running (or have exited 0) a moment
// later, and is stopped when its page is done. Later commands of the page
// run while it does ('nats reply' answers the task published after it).
var docsFollow = []string{
	"nats sub ", "nats reply ", "gantry worker", "gantry scheduler", "gantry healthd", "gantry auditd",
	"gantry run", "gantry broker",
}

// docsRemote are the remote broker URLs the examples use; the test points
// them at its own broker.
var docsRemote = regexp.MustCompile(`nats://[a-z][a-z0-9.-]*:4222`)

// docsHTTP is the default HTTP address the examples use; the test points
// it at its own gantry's.
var docsHTTP = regexp.MustCompile(`http://127\.0\.0\.1:8420`)

// docsFiles are the scratch files the examples name.
var docsFiles = map[string]string{
	"summary.json": `{"cmd":["echo","summary"]}`,
	"report.json":  `{"cmd":["echo","report"]}`,
	"capture.sh":   "#!/bin/sh\necho \"captured $2 frames on $GANTRY_RESOURCE\"\n",
	"urgent.sh":    "#!/bin/sh\necho urgent\n",
	"Makefile":     "report:\n\t@echo report made\n",
}

// docsConfig is the config of each page's 'gantry run' (and the scratch
// directory's gantry.yaml): the example config's resources and jobs, with
// the routes, database and job the pages name, probing local servers only.
const docsConfig = `routes:
  - {id: office, proxy: direct, probe_url: %[1]q, interval: 30s}
  - {id: plant-proxy, proxy: %[2]q, probe_url: %[1]q, interval: 30s}
databases:
  - {name: plant, driver: sqlite, dsn: %[3]q}
resources:
  - {id: label-printer}
jobs:
  - {name: heartbeat, type: noop, every: 10s}
  - {name: nightly, type: noop, cron: "0 3 * * *"}
`

// docCommand is one command of a page, with what it should do.
type docCommand struct {
	line   string
	exit   int
	output []string
}

// docCommands extracts the commands of a markdown page's fenced sh and
// console blocks.
func docCommands(t *testing.T, path string) []docCommand {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		cmds []docCommand
		lang string
		in   bool
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		// A line ending in a backslash goes on on the next.
		for strings.HasSuffix(line, "\\") && sc.Scan() {
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(sc.Text())
		}
		if fence, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
			in, lang = !in, fence
			continue
		}
		if !in {
			continue
		}
		switch lang {
		case "sh", "bash", "shell":
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				c := docCommand{line: l}
				if m := shExitNote.FindStringSubmatch(l); m != nil {
					c.exit, _ = strconv.Atoi(m[1])
				}
				cmds = append(cmds, c)
			}
		case "console":
			if c, ok := strings.CutPrefix(line, "$ "); ok {
				cmds = append(cmds, docCommand{line: c})
				continue
			}
			if len(cmds) == 0 || strings.TrimSpace(line) == "" {
				continue
			}
			last := &cmds[len(cmds)-1]
			if m := exitNote.FindStringSubmatch(line); m != nil {
				last.exit, _ = strconv.Atoi(m[1])
				line = exitNote.ReplaceAllString(line, "")
			}
			last.output = append(last.output, line)
		}
	}
	return cmds
}

var (
	exitNote   = regexp.MustCompile(`\s*\(exit (\d+)\)\s*$`)
	shExitNote = regexp.MustCompile(`#.*\(exit (\d+)\)\s*$`)
	timeValue  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	numberWord = regexp.MustCompile(`\b\d+\b`)
)

// masked is a line with its times and numbers masked and its spaces
// collapsed, to compare a page's example output with a run's.
func masked(s string) string {
	s = timeValue.ReplaceAllString(s, "TIME")
	s = numberWord.ReplaceAllString(s, "N")
	return strings.Join(strings.Fields(s), " ")
}

// natsCLI finds the nats CLI: bin/nats of the checkout ('make test'
// installs it), or one on the PATH.
func natsCLI() string {
	if p, err := filepath.Abs("../../bin/nats"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	return ""
}

func TestDocsCommands(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"../../README.md"}, pages...)
	nats := natsCLI()
	if nats == "" && os.Getenv("CI") != "" {
		t.Fatal("no nats CLI in bin/ or on the PATH: 'make test' installs it (go install github.com/nats-io/natscli/nats@v0.5.0)")
	}
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf("#!/bin/sh\nGANTRY_TEST_MAIN=1 exec %q \"$@\"\n", self)
	if err := os.WriteFile(filepath.Join(bin, "gantry"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if nats != "" {
		if err := os.Symlink(nats, filepath.Join(bin, "nats")); err != nil {
			t.Fatal(err)
		}
	}
	for _, page := range pages {
		cmds := docCommands(t, page)
		if len(cmds) == 0 {
			continue
		}
		t.Run(filepath.Base(page), func(t *testing.T) {
			t.Parallel()
			runDocPage(t, bin, nats != "", cmds)
		})
	}
}

// runDocPage starts a 'gantry run' and runs a page's commands against it,
// in order.
func runDocPage(t *testing.T, bin string, haveNATS bool, cmds []docCommand) {
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(site.Close)
	proxy := proxytest.Start(t, proxytest.HTTPConnect)
	scratch := t.TempDir()
	cfg := fmt.Sprintf(docsConfig, site.URL, proxy.URL(), "file:"+filepath.Join(scratch, "plant.db"))
	for name, body := range docsFiles {
		if err := os.WriteFile(filepath.Join(scratch, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(scratch, "gantry.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// Its exec tasks run in the scratch directory, as the examples expect.
	_, ready := startGantryIn(t, scratch, "run", "--data", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--config", filepath.Join(scratch, "gantry.yaml"))
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"NATS_URL="+ready.NATS, "XDG_CONFIG_HOME="+t.TempDir(), "NATS_CONTEXT=")

	for _, c := range cmds {
		line := docsRemote.ReplaceAllString(c.line, ready.NATS)
		line = docsPaths.ReplaceAllString(line, "$1./$2/")
		line = docsHTTP.ReplaceAllString(line, ready.HTTP)
		if (strings.HasPrefix(line, "gantry run") || strings.HasPrefix(line, "gantry broker")) && !strings.Contains(line, "--nats-listen") {
			// Not the default ports: a person's gantry may hold them.
			line += " --nats-listen 127.0.0.1:0 --http-listen 127.0.0.1:0"
		}
		if why, ok := notRun(line); ok {
			t.Logf("not run: %s: %s", c.line, why)
			continue
		}
		if strings.HasPrefix(line, "nats ") && !haveNATS {
			t.Logf("not run: %s: no nats CLI (make test installs it)", c.line)
			continue
		}
		cmd := exec.Command("bash", "-c", line)
		cmd.Dir, cmd.Env = scratch, env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if follows(line) {
			followDoc(t, c.line, cmd, &out)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := runBounded(ctx, cmd)
		cancel()
		code := 0
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Errorf("%s: %v\n%s", c.line, err, out.String())
			continue
		}
		if code != c.exit {
			t.Errorf("%s = exit %d, want %d; output:\n%s", c.line, code, c.exit, out.String())
			continue
		}
		checkOutput(t, c, out.String())
	}
}

// notRun says why a command cannot run in a test, if it cannot.
func notRun(line string) (string, bool) {
	for prefix, why := range docsNotRun {
		if strings.HasPrefix(line, prefix) {
			return why, true
		}
	}
	return "", false
}

// follows reports whether a command runs until interrupted.
func follows(line string) bool {
	if strings.HasPrefix(line, "gantry audit tail") && !strings.Contains(line, "--count") {
		return true
	}
	for _, p := range docsFollow {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

// followDoc starts a command that runs until interrupted, checks that it
// is still running (or ended well) a moment later, and stops it when the
// page is done.
func followDoc(t *testing.T, line string, cmd *exec.Cmd, out *bytes.Buffer) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("%s ended at once: %v\n%s", line, err, out.String())
		}
	case <-time.After(1500 * time.Millisecond):
	}
}

// runBounded runs cmd, killing its process group if ctx ends first.
func runBounded(ctx context.Context, cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("still running after 30s")
	}
}

// checkOutput checks that every line a console example shows is in the
// command's output, times and numbers masked.
func checkOutput(t *testing.T, c docCommand, got string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(got, "\n") {
		have[masked(l)] = true
	}
	for _, want := range c.output {
		if !have[masked(want)] {
			t.Errorf("%s: output has no line like %q; got:\n%s", c.line, want, got)
		}
	}
}
