package workers

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/proctree"
	"github.com/gantry-dev/gantry/internal/proctree/proctreetest"
)

// escapeScript starts a background child, a setsid child and a
// double-forked setsid grandchild, each writing its pid to $PIDS; once all
// three have, it runs $THEN.
const escapeScript = `sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &
setsid sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &
(setsid sh -c 'echo $$ >> "$PIDS"; exec sleep 300' &)
while [ "$(cat "$PIDS" 2>/dev/null | wc -l)" -lt 3 ]; do sleep 0.01; done
eval "$THEN"`

// TestExecLeavesNoProcess: nothing an exec task starts outlives it, be it
// a background child, a setsid one or a double fork, whether the task
// succeeds, fails, times out or is cancelled; and a background child does not
// turn success into failure. Under a cgroup (where the machine allows it)
// and under a subreaper.
func TestExecLeavesNoProcess(t *testing.T) {
	t.Parallel()
	for _, c := range []proctree.Containment{proctree.Cgroup, proctree.Subreaper} {
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			trees := proctree.Config{Containment: c, Shim: shim(t)}
			if _, err := proctree.New(trees); err != nil {
				t.Skipf("%s containment is not allowed on this machine: %v", c, err)
			}
			b := setup(t)
			// A long KillGrace: output still held by a survivor would keep
			// the task that long.
			b.start(t, Config{Policy: fastPolicy, KillGrace: time.Minute, ProcessTrees: trees}, nil)
			for _, tc := range []struct {
				id    string
				then  string
				extra string
				end   func(t *testing.T, id string)
				want  wire.TaskState
			}{
				{"ok", "echo bye", `,"max_attempts":1`, func(*testing.T, string) {}, wire.TaskSucceeded},
				{"fail", "exit 3", `,"max_attempts":1`, func(*testing.T, string) {}, wire.TaskNeedsReview},
				{"timeout", "sleep 300", `,"timeout":"1s","max_attempts":1`, func(*testing.T, string) {}, wire.TaskNeedsReview},
				{"cancel", "sleep 300", "", func(t *testing.T, id string) {
					if err := b.env.NC.Publish(wire.SubjectTaskCancel, cancelRequest(t, id)); err != nil {
						t.Fatal(err)
					}
				}, wire.TaskCancelled},
			} {
				t.Run(tc.id, func(t *testing.T) {
					t.Parallel()
					id := string(c) + "-" + tc.id
					pidFile := filepath.Join(t.TempDir(), "pids")
					b.publish(t, wire.TaskSubject("", "exec"), execTask(id, wire.ExecPayload{
						Cmd: []string{"sh", "-c", escapeScript}, Env: map[string]string{"PIDS": pidFile, "THEN": tc.then},
					}, tc.extra))
					pids := proctreetest.ReadPids(t, pidFile, 3)
					tc.end(t, id)
					rec := b.waitState(t, id, tc.want, 20*time.Second)
					if tc.want == wire.TaskSucceeded && (rec.Attempts != 1 || rec.Output != "bye\n") {
						t.Errorf("record = attempts %d, output %q; want 1 and %q", rec.Attempts, rec.Output, "bye\n")
					}
					if want := map[string]string{"fail": "exit code 3", "timeout": "timed out"}[tc.id]; !strings.Contains(rec.LastError, want) {
						t.Errorf("last error = %q, want %q", rec.LastError, want)
					}
					proctreetest.WaitDead(t, "the whole tree is killed", pids...)
				})
			}
		})
	}
}
