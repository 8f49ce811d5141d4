package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/proctree"
)

// execHandler is the built-in exec handler.
type execHandler struct{ w *Workers }

func (h execHandler) Run(ctx context.Context, t *Task) error { return h.w.runExec(ctx, t) }

// check tells whether t's command can start at all, before its resource is
// taken: a command that is missing or not executable, or a dir that does
// not exist, is a permanent failure that never moves the resource to
// RUNNING. What only starting can tell is left to Run.
func (execHandler) check(t *Task) error {
	var p wire.ExecPayload
	if err := decodePayload(t, &p); err != nil {
		return err
	}
	if len(p.Cmd) == 0 || p.Cmd[0] == "" {
		return errEmptyCmd
	}
	cmd := exec.Command(p.Cmd[0], p.Cmd[1:]...)
	cmd.Dir = p.Dir
	if err := proctree.Check(cmd); cannotStart(err) {
		return Permanent(fmt.Errorf("exec: %w", err))
	}
	return nil
}

// cannotStart reports whether err says a command cannot start as given, so
// that retrying changes nothing.
func cannotStart(err error) bool {
	return errors.Is(err, proctree.ErrNotFound) || errors.Is(err, proctree.ErrNotExecutable) || errors.Is(err, proctree.ErrBadDir)
}

var errEmptyCmd = permanentf("exec payload: cmd is empty: want [\"prog\", \"arg\", …]")

// runExec is the built-in exec: it runs the payload's command as a process
// tree that timeout and cancel kill as a whole.
func (w *Workers) runExec(ctx context.Context, t *Task) error {
	var p wire.ExecPayload
	if err := decodePayload(t, &p); err != nil {
		return err
	}
	if len(p.Cmd) == 0 || p.Cmd[0] == "" {
		return errEmptyCmd
	}
	cpFile, cpBefore, err := w.checkpointFile(ctx, t)
	if err != nil {
		return err
	}
	defer os.Remove(cpFile)

	// The end of ctx (timeout, cancel, drain) terminates the tree, and
	// KillGrace later kills it.
	cmd := exec.CommandContext(ctx, p.Cmd[0], p.Cmd[1:]...)
	cmd.Dir = p.Dir
	env := os.Environ()
	for k, v := range p.Env {
		env = append(env, k+"="+v)
	}
	env = append(env, wire.EnvTaskID+"="+t.ID, wire.EnvAttempt+"="+strconv.Itoa(t.Attempt), wire.EnvCheckpointFile+"="+cpFile)
	if t.Resource != "" {
		env = append(env, wire.EnvResource+"="+t.Resource)
	}
	if t.LeaseRevision != 0 {
		env = append(env, wire.EnvLeaseRevision+"="+strconv.FormatUint(t.LeaseRevision, 10))
	}
	cmd.Env = env
	cmd.Stdin = strings.NewReader(p.Stdin)
	stdout, stderr := newTail(w.cfg.OutputTail), newTail(w.cfg.OutputTail)
	cmd.Stdout, cmd.Stderr = t.tee(wire.OutputStdout, stdout), t.tee(wire.OutputStderr, stderr)
	cmd.WaitDelay = w.cfg.KillGrace
	tree, err := w.trees.Start(cmd)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("exec %s: stopped before it started: %w", p.Cmd[0], context.Cause(ctx))
	case cannotStart(err):
		// The command cannot start as given: retrying changes nothing.
		return Permanent(fmt.Errorf("exec: %w", err))
	case err != nil:
		return fmt.Errorf("exec %s: start: %w", p.Cmd[0], err)
	}
	// Wait kills what the process left running: nothing of the task's tree
	// outlives the task.
	waitErr := tree.Wait()
	// A process that ended on its own before ctx did keeps its result.
	stopped := waitErr != nil && ctx.Err() != nil

	t.SetOutput(joinOutput(stdout.String(), stderr.String()))
	w.saveCheckpointFile(ctx, t, cpFile, cpBefore)
	if stopped {
		return fmt.Errorf("exec %s: stopped: %w", p.Cmd[0], context.Cause(ctx))
	}
	if waitErr == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) {
		return fmt.Errorf("exec %s: %w", p.Cmd[0], waitErr)
	}
	code := proctree.ExitStatus(ee.ProcessState)
	failure := fmt.Errorf("exec %s: exit code %d", p.Cmd[0], code)
	if line := lastLine(stderr.String()); line != "" {
		// The error goes into the record, events and logs: redacted as
		// the output is.
		failure = fmt.Errorf("%w: %s", failure, redactText(wire.RedactLine(line), secretValues(t.Payload)))
	}
	switch {
	case slices.Contains(p.FailExitCodes, code):
		return Permanent(failure)
	case slices.Contains(p.DelayExitCodes, code):
		return RetryAfter(failure, 0)
	}
	return failure
}

// checkpointFile writes the task's last checkpoint to a new file for the
// process to read and overwrite.
func (w *Workers) checkpointFile(ctx context.Context, t *Task) (string, []byte, error) {
	cp, err := t.Checkpoint(ctx)
	if err != nil {
		return "", nil, err
	}
	f, err := os.CreateTemp(w.cpDir, "checkpoint-*.json")
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint file: %w", err)
	}
	defer f.Close()
	var data []byte
	if cp != nil {
		if data, err = json.Marshal(cp); err != nil {
			return "", nil, fmt.Errorf("encode checkpoint: %w", err)
		}
		if _, err := f.Write(data); err != nil {
			return "", nil, fmt.Errorf("checkpoint file: %w", err)
		}
	}
	return f.Name(), data, nil
}

// saveCheckpointFile saves what the process left in its checkpoint file,
// if it changed it.
func (w *Workers) saveCheckpointFile(ctx context.Context, t *Task, path string, before []byte) {
	data, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(data)) == 0 || bytes.Equal(data, before) {
		return
	}
	var cp wire.Checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		w.log.Warn("checkpoint file is not a checkpoint", "task_id", t.ID, "err", err)
		return
	}
	if err := t.SaveCheckpoint(context.WithoutCancel(ctx), cp); err != nil {
		w.log.Warn("save checkpoint", "task_id", t.ID, "err", err)
	}
}

func joinOutput(stdout, stderr string) string {
	switch {
	case stderr == "":
		return stdout
	case stdout == "":
		return stderr
	}
	return stdout + "\n--- stderr ---\n" + stderr
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return tailString(s, 200)
}
