package proctree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Containment is how a Starter holds its trees together.
type Containment string

const (
	// Auto is the strongest containment the machine allows: Cgroup, else
	// Subreaper if Config.Shim is set, else Group (Linux); Group elsewhere.
	Auto Containment = "auto"
	// Group is a process group the command leads (Unix), with a
	// parent-death signal on Linux; a Job Object on Windows.
	Group Containment = "group"
	// Cgroup is a cgroup v2 of its own per tree, under this process's
	// cgroup when that is delegated to it (Linux).
	Cgroup Containment = "cgroup"
	// Subreaper is a shim process per tree, the child subreaper of the
	// command and of everything it starts (Linux; needs Config.Shim).
	Subreaper Containment = "subreaper"
)

// ParseContainment reads a containment by name: auto, group, cgroup or
// subreaper.
func ParseContainment(s string) (Containment, error) {
	switch c := Containment(s); c {
	case Auto, Group, Cgroup, Subreaper:
		return c, nil
	}
	return "", fmt.Errorf("containment %q: want auto, group, cgroup or subreaper", s)
}

// Config configures a Starter.
type Config struct {
	// Containment is how trees are held together. Defaults to Auto; any
	// other value fails New if the machine does not allow it.
	Containment Containment
	// Shim is the executable a Subreaper tree runs as its shim: a program
	// whose main calls ShimMain first thing (gantry's own executable). It
	// also proves, once, that a Cgroup tree can be started. Empty: no
	// shim, so Auto never picks Subreaper.
	Shim string
}

// Starter starts commands as process trees, every one contained the way
// New chose. It is safe for concurrent use.
type Starter struct {
	containment Containment
	sys         container
}

// New chooses how trees are contained, probing the machine once: see
// Containment.
func New(cfg Config) (*Starter, error) {
	want := cfg.Containment
	if want == "" {
		want = Auto
	}
	if _, err := ParseContainment(string(want)); err != nil {
		return nil, err
	}
	got, sys, err := newContainer(want, cfg.Shim)
	if err != nil {
		return nil, fmt.Errorf("proctree: %w", err)
	}
	return &Starter{containment: got, sys: sys}, nil
}

// Containment is how this Starter's trees are held together: never Auto.
func (s *Starter) Containment() Containment { return s.containment }

// container holds trees together one way.
type container interface {
	// prepare sets cmd up to start as the root of a new tree, and returns
	// what to do once cmd.Start has returned: take hold of the started
	// process's tree, or undo prepare when p is nil.
	prepare(cmd *exec.Cmd) (started func(p *os.Process) (holder, error), err error)
}

// holder is one tree, held together.
type holder interface {
	// signal sends sig to every process of the tree; os.ErrProcessDone if
	// there is none left to send it to.
	signal(sig os.Signal) error
	// terminate asks every process of the tree to stop.
	terminate() error
	// kill kills every process of the tree.
	kill() error
	// release kills what is left of the tree once the command has exited,
	// and frees what holds the tree.
	release() error
}

var (
	// ErrNotFound is the error of Start for a command whose program does
	// not exist (a shell's exit 127).
	ErrNotFound = errors.New("not found")
	// ErrNotExecutable is the error of Start for a command whose program
	// exists but cannot be executed: no execute permission, a directory,
	// not a program, a missing interpreter (a shell's exit 126).
	ErrNotExecutable = errors.New("not executable")
	// ErrBadDir is the error of Start for a command whose Dir does not
	// exist, is not a directory or cannot be entered.
	ErrBadDir = errors.New("bad dir")
)

// startError is a command that cannot start as given: a message of its
// own that wraps one of ErrNotFound, ErrNotExecutable and ErrBadDir.
type startError struct {
	msg  string
	kind error
}

func (e *startError) Error() string { return e.msg }
func (e *startError) Unwrap() error { return e.kind }

func startErrorf(kind error, format string, args ...any) error {
	return &startError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// Check tells, without starting anything, whether cmd could start as
// given: an error wrapping ErrNotFound, ErrNotExecutable or ErrBadDir if
// not. Start checks the same; a caller that must not act before a command
// that cannot start (take a resource for it, say) checks first.
func Check(cmd *exec.Cmd) error {
	if err := checkDir(cmd.Dir); err != nil {
		return err
	}
	return checkProgram(cmd)
}

// checkDir refuses a Dir the command could not start in.
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return startErrorf(ErrBadDir, "dir %s: no such directory", dir)
	case errors.Is(err, os.ErrPermission):
		return startErrorf(ErrBadDir, "dir %s: permission denied", dir)
	case err != nil:
		return fmt.Errorf("dir %s: %w", dir, err)
	case !fi.IsDir():
		return startErrorf(ErrBadDir, "dir %s: not a directory", dir)
	}
	return nil
}

// name is the command's program as the caller named it.
func name(cmd *exec.Cmd) string {
	if len(cmd.Args) > 0 {
		return cmd.Args[0]
	}
	return cmd.Path
}

// Tree is a started command and every process it starts.
type Tree struct {
	cmd *exec.Cmd
	// grace is the command's WaitDelay, which Tree applies itself: the
	// time from terminate to kill once the context has ended, and the
	// most Wait waits for output still held after the tree is killed.
	grace time.Duration

	// streams are the pipes the command's standard streams go through when
	// they are not files; each copying goroutine sends its error on copied.
	streams []stream
	copied  chan error

	mu    sync.Mutex
	tree  holder      // the tree, held together
	done  bool        // the tree is gone: released after the command exited
	timer *time.Timer // kills the tree grace after its context ended
}

// stream is one standard stream of the command, copied through a pipe.
type stream struct {
	parent *os.File     // gantry's end
	child  *os.File     // the command's end, closed in gantry once it has started
	copy   func() error // copies between parent and the caller's reader or writer
}

// Start starts cmd as the root of a new process tree. cmd must not have
// been started and its SysProcAttr must be nil; with a Subreaper, Start
// makes cmd start the shim, which starts the command (cmd.Process is then
// the shim).
//
// A command that cannot start as given returns an error wrapping
// ErrNotFound, ErrNotExecutable or ErrBadDir, and nothing was started.
//
// A Stdin, Stdout or Stderr that is not an *os.File is copied through a
// pipe that Tree owns (a Stdout and Stderr that are the same writer share
// one), so that Wait returns when the command exits, not when the last
// process holding a pipe does. If cmd was made by exec.CommandContext, its
// Cancel is replaced: the end of the context terminates the tree, and
// cmd.WaitDelay later kills it; without a WaitDelay it kills the tree at
// once. Tree takes cmd.WaitDelay over (and sets it to zero), so that
// exec.Cmd never kills just the process it started.
//
// Once Start has succeeded, Wait must be called.
func (s *Starter) Start(cmd *exec.Cmd) (*Tree, error) {
	if cmd.SysProcAttr != nil {
		return nil, errors.New("proctree: cmd.SysProcAttr is set: Start sets it to make the tree")
	}
	if err := Check(cmd); err != nil {
		return nil, err
	}
	prog, argv0 := cmd.Path, name(cmd)
	t := &Tree{cmd: cmd, grace: cmd.WaitDelay}
	cmd.WaitDelay = 0
	if cmd.Cancel != nil {
		cmd.Cancel = t.cancel
	}
	if err := t.pipe(); err != nil {
		t.closePipes()
		return nil, err
	}
	started, err := s.sys.prepare(cmd)
	if err != nil {
		t.closePipes()
		return nil, err
	}
	// cmd.Cancel may run as soon as the process is started: it waits for
	// the tree to be held.
	t.mu.Lock()
	err = cmd.Start()
	for _, s := range t.streams {
		_ = s.child.Close()
	}
	if err != nil {
		_, _ = started(nil)
		t.done = true
		t.mu.Unlock()
		t.closePipes()
		return nil, startFailed(prog, argv0, cmd.Dir, err)
	}
	if t.tree, err = started(cmd.Process); err != nil {
		t.done = true
		t.mu.Unlock()
		_ = cmd.Process.Kill()
		t.closePipes()
		_ = cmd.Wait()
		return nil, startFailed(prog, argv0, cmd.Dir, err)
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

// Signal sends sig to every process of the tree (a Group tree: to its
// process group). On Windows only os.Interrupt (sent as CTRL_BREAK to the
// command's console process group) and os.Kill are supported. After Wait,
// or on Unix once the tree is empty, it returns os.ErrProcessDone.
func (t *Tree) Signal(sig os.Signal) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return os.ErrProcessDone
	}
	return t.tree.signal(sig)
}

// Kill kills every process of the tree. After Wait, or on Unix once the
// tree is empty, it returns os.ErrProcessDone.
func (t *Tree) Kill() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return os.ErrProcessDone
	}
	return t.tree.kill()
}

// cancel is the Cancel of a command made by exec.CommandContext: it
// terminates the tree (SIGTERM on Unix, CTRL_BREAK on Windows) and kills it
// WaitDelay later if the command is still running, or kills it at once
// when there is no WaitDelay.
func (t *Tree) cancel() error {
	if t.grace <= 0 {
		return t.Kill()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return os.ErrProcessDone
	}
	t.timer = time.AfterFunc(t.grace, func() { _ = t.Kill() })
	return t.tree.terminate()
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
	if t.timer != nil {
		t.timer.Stop()
	}
	if !t.done {
		if rerr := t.tree.release(); err == nil && rerr != nil {
			err = fmt.Errorf("kill what the command left running: %w", rerr)
		}
		t.done = true
	}
	t.mu.Unlock()
	if cerr := t.drain(); err == nil {
		err = cerr
	}
	return err
}

// drain waits for the copying goroutines, cutting the pipes off after
// the grace if there is one, and returns the first error of a copy that
// was not cut off.
func (t *Tree) drain() error {
	defer func() {
		t.closePipes()
		t.streams = nil
	}()
	var cutoff <-chan time.Time
	if d := t.grace; d > 0 && len(t.streams) > 0 {
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
// exited: its exit code, or 128+N if signal N killed it (Unix). For a
// tree under a Subreaper shim, the process is the shim, which exits with
// that status of the command.
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

// ShimMain runs this process as the Subreaper shim of one tree, and exits
// with the command's status, if a Starter started it as one; otherwise it
// returns at once. The program named by Config.Shim calls it first thing
// in main (a test binary: in TestMain).
func ShimMain() {
	if len(os.Args) > 1 && os.Args[1] == shimArg {
		// The shim has nothing to flush, and os.Exit would wait a second
		// in a build with the race detector.
		syscall.Exit(runShim(os.Args[2:]))
	}
}

// shimArg is the first argument of a shim.
const shimArg = "__proctree-shim"

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
