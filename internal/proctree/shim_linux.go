//go:build linux

package proctree

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// shimStartTimeout bounds the wait for a shim to say whether it
	// started the command.
	shimStartTimeout = 10 * time.Second
	// shimKillTimeout is how long a shim waits for the processes it
	// killed to exit (one in uninterruptible sleep may never) before it
	// exits and leaves them.
	shimKillTimeout = 10 * time.Second
)

// shims holds each tree under a shim: the program path re-executed with
// ShimMain's argument, which makes itself the child subreaper of the
// command it starts. A descendant whose parent exits is re-parented to
// the shim, not to init, whatever it does (setsid, a double fork), so the
// shim can find and kill every descendant: when the command exits, when
// gantry asks, and when gantry dies.
//
// gantry and the shim talk over a socket pair: the shim answers with the
// errno of starting the command (0: started); gantry sends a byte per
// signal to pass on to every descendant, and closes its end to have the
// shim kill them all (the kernel closes it when gantry dies). The shim
// exits with the command's status as a shell reports it (128+N for signal
// N), once every descendant is gone.
type shims struct{ path string }

func (s shims) prepare(cmd *exec.Cmd) (func(*os.Process) (holder, error), error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shim socket: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		return nil, fmt.Errorf("shim socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "proctree-shim"), os.NewFile(uintptr(fds[1]), "proctree-shim")
	prog, argv := cmd.Path, cmd.Args
	if len(argv) == 0 {
		argv = []string{prog}
	}
	ctlFD := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(slices.Clip(cmd.ExtraFiles), theirs)
	cmd.Path = s.path
	cmd.Args = append([]string{s.path, shimArg, strconv.Itoa(ctlFD), prog}, argv...)
	// The shim leads a process group, which the command joins: a terminal's
	// signals do not reach them, as with Group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return func(p *os.Process) (holder, error) {
		_ = theirs.Close()
		if p == nil {
			_ = ours.Close()
			return nil, nil
		}
		sh := &shim{ctl: ours, pgid: p.Pid}
		if err := sh.started(s.path, prog); err != nil {
			_ = ours.Close()
			return nil, err
		}
		return sh, nil
	}, nil
}

// shim is a tree under a shim, seen from gantry. Its methods run under
// Tree.mu.
type shim struct {
	ctl    *os.File
	pgid   int
	closed bool // ctl is closed: the shim was told to kill the tree
}

// started waits for the shim to say whether it started prog.
func (s *shim) started(path, prog string) error {
	if err := s.ctl.SetReadDeadline(time.Now().Add(shimStartTimeout)); err != nil {
		return err
	}
	var b [4]byte
	if _, err := io.ReadFull(s.ctl, b[:]); err != nil {
		return fmt.Errorf("shim %s did not start the command (does its main call proctree.ShimMain?): %w", path, err)
	}
	if errno := syscall.Errno(binary.LittleEndian.Uint32(b[:])); errno != 0 {
		return &os.PathError{Op: "fork/exec", Path: prog, Err: errno}
	}
	return s.ctl.SetReadDeadline(time.Time{})
}

// signal has the shim send sig to every descendant.
func (s *shim) signal(sig os.Signal) error {
	n, ok := sig.(syscall.Signal)
	if !ok || n <= 0 || n > 255 {
		return fmt.Errorf("signal %v: not a Unix signal", sig)
	}
	if n == syscall.SIGKILL {
		return s.kill()
	}
	if s.closed {
		return os.ErrProcessDone
	}
	if _, err := s.ctl.Write([]byte{byte(n)}); err != nil {
		// The shim has exited.
		return os.ErrProcessDone
	}
	return nil
}

func (s *shim) terminate() error { return s.signal(syscall.SIGTERM) }

// kill closes the socket: the shim kills every descendant.
func (s *shim) kill() error {
	if s.closed {
		return os.ErrProcessDone
	}
	s.closed = true
	return s.ctl.Close()
}

// release closes the socket (the shim has exited, and killed the tree
// first), and kills what is left of the shim's process group in case the
// shim itself was killed from outside.
func (s *shim) release() error {
	if !s.closed {
		s.closed = true
		_ = s.ctl.Close()
	}
	return group(s.pgid).release()
}

// runShim is the shim: args are the control socket's descriptor, the
// program and its argv. Descriptors 3 up to the socket's are passed on to
// the command. "probe" alone exits 0 at once (newCgroups starts it).
func runShim(args []string) int {
	if len(args) == 1 && args[0] == "probe" {
		return 0
	}
	fd := -1
	if len(args) >= 3 {
		fd, _ = strconv.Atoi(args[0])
	}
	if fd < 3 {
		fmt.Fprintln(os.Stderr, "proctree shim: want FD PROGRAM ARGV0 [ARG...]")
		return 2
	}
	syscall.CloseOnExec(fd)
	ctl := os.NewFile(uintptr(fd), "proctree-control")
	report := func(err error) {
		var errno syscall.Errno
		if err != nil && !errors.As(err, &errno) {
			errno = syscall.EINVAL
		}
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(errno))
		_, _ = ctl.Write(b[:])
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		report(err)
		return 1
	}
	// Signals sent to the shim itself (by an operator, or a terminal) are
	// passed on to the tree.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM)
	files := make([]uintptr, fd)
	for i := range files {
		files[i] = uintptr(i)
	}
	// The command dies with the shim, should the shim be killed.
	child, err := syscall.ForkExec(args[1], args[2:], &syscall.ProcAttr{
		Env: os.Environ(), Files: files, Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		report(err)
		return 127
	}
	report(nil)
	self := os.Getpid()
	go func() {
		for s := range sigs {
			signalTree(self, s.(syscall.Signal))
		}
	}()
	go func() {
		b := make([]byte, 1)
		for {
			if _, err := ctl.Read(b); err != nil {
				// gantry closed its end, or died.
				signalTree(self, syscall.SIGKILL)
				return
			}
			signalTree(self, syscall.Signal(b[0]))
		}
	}()
	return reap(self, child)
}

// reap reaps the shim's children until none is left, and returns the
// command's status as a shell reports it. Once the command has exited,
// every reap kills what is left: a process forked just as the tree was
// killed is found by the sweep after its parent's exit.
func reap(self, child int) int {
	status := -1
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: every descendant is gone.
			return status
		}
		if pid == child {
			status = shellStatus(ws)
			exit := status
			time.AfterFunc(shimKillTimeout, func() { os.Exit(exit) })
		}
		if status >= 0 {
			signalTree(self, syscall.SIGKILL)
		}
	}
}

// shellStatus is the status a shell reports for ws.
func shellStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// signalTree sends sig to every descendant of the shim, parents first: a
// shell waiting for its children would otherwise see them die and exit 0
// before its own signal reached it.
func signalTree(self int, sig syscall.Signal) {
	pids := descendants(self)
	tree := make(map[int]bool, len(pids))
	for _, pid := range pids {
		tree[pid] = true
	}
	for _, pid := range pids {
		_ = signalPinned(pid, sig, func() bool {
			ppid, err := parentOf(pid)
			return err == nil && (ppid == self || tree[ppid])
		})
	}
}
