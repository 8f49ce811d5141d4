package proctree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// Tree is a started command and every process it starts.
type Tree struct {
	cmd *exec.Cmd

	// streams are the pipes the command's standard streams go through when
	// they are not files; each copying goroutine sends its error on copied.
	streams []stream
	copied  chan error

	mu   sync.Mutex
	tree sysTree // the operating system's handle on the tree
	done bool    // the tree is gone: killed after the command exited, and released
}

// stream is one standard stream of the command, copied through a pipe.
type stream struct {
	parent *os.File     // gantry's end
	child  *os.File     // the command's end, closed in gantry once it has started
	copy   func() error // copies between parent and the caller's reader or writer
}

// Start starts cmd as the root of a new process tree. cmd must not have
// been started and its SysProcAttr must be nil.
//
// A Stdin, Stdout or Stderr that is not an *os.File is copied through a
// pipe that Tree owns (a Stdout and Stderr that are the same writer share
// one), so that Wait returns when the command exits, not when the last
// process holding a pipe does. If cmd was made by exec.CommandContext, its
// Cancel is replaced: the end of the context terminates the tree, and
// cmd.WaitDelay later kills it; without a WaitDelay it kills the tree at
// once.
//
// Once Start has succeeded, Wait must be called.
func Start(cmd *exec.Cmd) (*Tree, error) {
	if cmd.SysProcAttr != nil {
		return nil, errors.New("proctree: cmd.SysProcAttr is set: Start sets it to make the tree")
	}
	t := &Tree{cmd: cmd}
	cmd.SysProcAttr = sysProcAttr()
	if cmd.Cancel != nil {
		cmd.Cancel = t.cancel
	}
	if err := t.pipe(); err != nil {
		t.closePipes()
		return nil, err
	}
	// cmd.Cancel may run as soon as the process is started: it waits for
	// the tree to be tracked.
	t.mu.Lock()
	err := cmd.Start()
	for _, s := range t.streams {
		_ = s.child.Close()
	}
	if err != nil {
		t.done = true
		t.mu.Unlock()
		t.closePipes()
		return nil, err
	}
	if t.tree, err = track(cmd.Process); err != nil {
		t.done = true
		t.mu.Unlock()
		_ = cmd.Process.Kill()
		t.closePipes()
		_ = cmd.Wait()
		return nil, err
	}
	t.mu.Unlock()
	t.copied = make(chan error, len(t.streams))
	for _, s := range t.streams {
		go func() { t.copied <- s.copy() }()
	}
	return t, nil
}

// pipe puts every standard stream of the command that is not a file
// behind a pipe.
func (t *Tree) pipe() error {
	c := t.cmd
	if r := c.Stdin; r != nil && !isFile(r) {
		pr, pw, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("stdin pipe: %w", err)
		}
		c.Stdin = pr
		t.streams = append(t.streams, stream{parent: pw, child: pr, copy: func() error {
			_, err := io.Copy(pw, r)
			if brokenPipe(err) {
				// The command did not read all of its input: its business.
				err = nil
			}
			if cerr := pw.Close(); err == nil {
				err = cerr
			}
			return err
		}})
	}
	stdout, stderr := c.Stdout, c.Stderr
	if stdout != nil && !isFile(stdout) {
		pw, err := t.pipeOutput(stdout)
		if err != nil {
			return fmt.Errorf("stdout pipe: %w", err)
		}
		c.Stdout = pw
	}
	switch {
	case sameWriter(stderr, stdout):
		c.Stderr = c.Stdout
	case stderr != nil && !isFile(stderr):
		pw, err := t.pipeOutput(stderr)
		if err != nil {
			return fmt.Errorf("stderr pipe: %w", err)
		}
		c.Stderr = pw
	}
	return nil
}

// pipeOutput returns the write end of a pipe whose output is copied to w.
func (t *Tree) pipeOutput(w io.Writer) (*os.File, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	t.streams = append(t.streams, stream{parent: pr, child: pw, copy: func() error {
		_, err := io.Copy(w, pr)
		return err
	}})
	return pw, nil
}

// closePipes closes both ends of every pipe.
func (t *Tree) closePipes() {
	for _, s := range t.streams {
		_ = s.parent.Close()
		_ = s.child.Close()
	}
}

// Signal sends sig to every process of the tree. On Windows only
// os.Interrupt (sent as CTRL_BREAK to the command's console process group)
// and os.Kill are supported. After Wait, or on Unix once the group is
// empty, it returns os.ErrProcessDone.
func (t *Tree) Signal(sig os.Signal) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return os.ErrProcessDone
	}
	return t.tree.signal(sig)
}

// Kill kills every process of the tree. After Wait, or on Unix once the
// group is empty, it returns os.ErrProcessDone.
func (t *Tree) Kill() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return os.ErrProcessDone
	}
	return t.tree.kill()
}

// terminate asks every process of the tree to stop: SIGTERM on Unix,
// CTRL_BREAK on Windows.
func (t *Tree) terminate() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return os.ErrProcessDone
	}
	return t.tree.terminate()
}

// cancel is the Cancel of a command made by exec.CommandContext: it
// terminates the tree, which exec.Cmd kills WaitDelay later if the command
// is still running, or kills it at once when there is no WaitDelay.
func (t *Tree) cancel() error {
	if t.cmd.WaitDelay > 0 {
		return t.terminate()
	}
	return t.Kill()
}

// Wait waits for the command to exit, kills what is left of its tree and
// releases the tree, then waits for the copying of its standard streams:
// at most cmd.WaitDelay, when set, for a pipe still held by a process that
// escaped the tree; what it writes after that is lost.
//
// Wait returns the command's own result, as exec.Cmd.Wait does (an
// *exec.ExitError for a non-zero exit; see ExitStatus). If the command
// succeeded, an error killing what it left or copying its streams is
// returned instead.
func (t *Tree) Wait() error {
	err := t.cmd.Wait()
	t.mu.Lock()
	if !t.done {
		if kerr := t.tree.kill(); err == nil && kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
			err = fmt.Errorf("kill what the command left running: %w", kerr)
		}
		t.tree.release()
		t.done = true
	}
	t.mu.Unlock()
	if cerr := t.drain(); err == nil {
		err = cerr
	}
	return err
}

// drain waits for the copying goroutines, cutting the pipes off after
// cmd.WaitDelay if set, and returns the first error of a copy that was not
// cut off.
func (t *Tree) drain() error {
	defer func() {
		t.closePipes()
		t.streams = nil
	}()
	var cutoff <-chan time.Time
	if d := t.cmd.WaitDelay; d > 0 && len(t.streams) > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		cutoff = timer.C
	}
	var first error
	for n := len(t.streams); n > 0; {
		select {
		case err := <-t.copied:
			n--
			if first == nil {
				first = err
			}
		case <-cutoff:
			// A process that escaped the tree holds a pipe: cut it off.
			// The copies then fail by our doing, not the command's.
			for _, s := range t.streams {
				_ = s.parent.Close()
			}
			for ; n > 0; n-- {
				<-t.copied
			}
		}
	}
	return first
}

// ExitStatus is the status a shell would report for a process that has
// exited: its exit code, or 128+N if signal N killed it (Unix).
func ExitStatus(ps *os.ProcessState) int {
	if sig, ok := killedBy(ps); ok {
		return 128 + sig
	}
	return ps.ExitCode()
}

// Interrupts are the signals that ask a program to stop on this operating
// system and that Signal can pass on to a tree: os.Interrupt and SIGTERM on
// Unix, os.Interrupt on Windows. A program that runs a tree in the
// foreground forwards them.
func Interrupts() []os.Signal { return interrupts() }

func isFile(v any) bool {
	_, ok := v.(*os.File)
	return ok
}

// sameWriter reports whether a and b are the same writer, decided as
// exec.Cmd does: then stdout and stderr share one pipe and one copy.
func sameWriter(a, b io.Writer) (same bool) {
	defer func() { _ = recover() }()
	return a != nil && a == b
}
