//go:build linux

package proctree

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRemoveTimeout bounds the wait for a killed cgroup to empty.
const cgroupRemoveTimeout = 10 * time.Second

// cgroups holds each tree in a cgroup v2 of its own, made in the cgroup
// this process is in. A tree's cgroup is named
// gantry-<pid>-<start time>-<random> after the process that made it, so
// that the cgroups of a process gone without removing them (killed with
// SIGKILL) are recognised, killed and removed by the next Starter made in
// the same cgroup.
type cgroups struct {
	dir    string // this process's cgroup directory
	rel    string // its path in the hierarchy, as /proc/<pid>/cgroup shows it
	prefix string // gantry-<pid>-<start time>-
}

// newCgroups probes this process's cgroup: cgroup v2, delegated to it,
// writable, with cgroup.kill (Linux 5.14); with a shim, it also starts the
// shim in a cgroup of its own once, to prove that the kernel (and any
// seccomp filter) lets a process start in one.
func newCgroups(shim string) (*cgroups, error) {
	rel, dir, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	if err := checkDelegated(rel, dir); err != nil {
		return nil, err
	}
	for _, f := range []string{dir, filepath.Join(dir, "cgroup.procs")} {
		if err := unix.Access(f, unix.W_OK); err != nil {
			return nil, fmt.Errorf("cgroup %s: %s not writable: %w", rel, f, err)
		}
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return nil, err
	}
	c := &cgroups{dir: dir, rel: rel, prefix: fmt.Sprintf("gantry-%d-%d-", pid, start)}
	c.sweep()
	if err := c.probe(shim); err != nil {
		return nil, err
	}
	return c, nil
}

// ownCgroup returns this process's cgroup v2: its path in the hierarchy
// and its directory in the cgroup2 mount.
func ownCgroup() (rel, dir string, err error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", "", err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = p
		}
	}
	if rel == "" {
		return "", "", errors.New("no cgroup v2 hierarchy (cgroup v1 only)")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	for line := range strings.SplitSeq(string(mounts), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		mf, ff := strings.Fields(pre), strings.Fields(post)
		if !ok || len(mf) < 5 || len(ff) < 1 || ff[0] != "cgroup2" {
			continue
		}
		root, mnt := mf[3], mf[4]
		switch {
		case root == "/":
			return rel, filepath.Join(mnt, rel), nil
		case rel == root:
			return rel, mnt, nil
		case strings.HasPrefix(rel, root+"/"):
			return rel, filepath.Join(mnt, strings.TrimPrefix(rel, root)), nil
		}
	}
	return "", "", fmt.Errorf("cgroup %s: no cgroup2 mount shows it", rel)
}

// checkDelegated accepts a cgroup this process may make cgroups in: one
// its manager delegated (systemd marks those with a delegate xattr:
// Delegate=yes), or the root of its cgroup namespace (a container, or a
// machine without a cgroup manager).
func checkDelegated(rel, dir string) error {
	if rel == "/" {
		return nil
	}
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		buf := make([]byte, 8)
		if n, err := unix.Getxattr(dir, attr, buf); err == nil && string(buf[:n]) == "1" {
			return nil
		}
	}
	return fmt.Errorf("cgroup %s is not delegated to this process (systemd: run it in a unit with Delegate=yes)", rel)
}

// probe makes a cgroup, checks it has cgroup.kill and, with a shim,
// starts the shim in it, then removes it.
func (c *cgroups) probe(shim string) error {
	g, err := c.make()
	if err != nil {
		return err
	}
	defer func() { _ = g.release() }()
	if _, err := os.Stat(filepath.Join(g.dir, "cgroup.kill")); err != nil {
		return fmt.Errorf("cgroup.kill (Linux 5.14): %w", err)
	}
	if shim == "" {
		return nil
	}
	f, err := os.Open(g.dir)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shim, shimArg, "probe")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("start %s in cgroup %s: %w (%q)", shim, g.rel, err, out)
	}
	return nil
}

// make makes a new cgroup for a tree.
func (c *cgroups) make() (*cgroup, error) {
	for {
		name := c.prefix + strconv.FormatUint(rand.Uint64(), 36)
		dir := filepath.Join(c.dir, name)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("make cgroup: %w", err)
		}
		return &cgroup{dir: dir, rel: filepath.Join(c.rel, name)}, nil
	}
}

// sweep kills and removes the trees' cgroups that a process gone before
// its trees left behind.
func (c *cgroups) sweep() {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		f := strings.Split(e.Name(), "-")
		if !e.IsDir() || len(f) != 4 || f[0] != "gantry" {
			continue
		}
		pid, perr := strconv.Atoi(f[1])
		start, serr := strconv.ParseUint(f[2], 10, 64)
		if perr != nil || serr != nil {
			continue
		}
		if st, err := startTime(pid); err == nil && st == start {
			continue // its maker is alive
		}
		g := &cgroup{dir: filepath.Join(c.dir, e.Name())}
		_ = g.release()
	}
}

func (c *cgroups) prepare(cmd *exec.Cmd) (func(*os.Process) (holder, error), error) {
	g, err := c.make()
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(g.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = g.release()
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	attr := groupAttr()
	attr.UseCgroupFD, attr.CgroupFD = true, fd
	cmd.SysProcAttr = attr
	return func(p *os.Process) (holder, error) {
		_ = unix.Close(fd)
		if p == nil {
			_ = g.release()
			return nil, nil
		}
		return g, nil
	}, nil
}

// cgroup is the cgroup v2 of one tree: the command started in it, and
// every process it starts is born in it and cannot leave it.
type cgroup struct {
	dir string
	rel string
}

// signal sends sig to every process in the cgroup.
func (g *cgroup) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("signal %v: not a Unix signal", sig)
	}
	if s == syscall.SIGKILL {
		return g.kill()
	}
	data, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	sent := false
	for f := range strings.FieldsSeq(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if signalPinned(pid, s, func() bool { return g.holds(pid) }) == nil {
			sent = true
		}
	}
	if !sent {
		return os.ErrProcessDone
	}
	return nil
}

// holds reports whether pid is in the cgroup.
func (g *cgroup) holds(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if line == "0::"+g.rel {
			return true
		}
	}
	return false
}

func (g *cgroup) terminate() error { return g.signal(syscall.SIGTERM) }

// kill kills every process in the cgroup at once.
func (g *cgroup) kill() error {
	if !g.populated() {
		return os.ErrProcessDone
	}
	if err := os.WriteFile(filepath.Join(g.dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("kill cgroup: %w", err)
	}
	return nil
}

// populated reports whether a process is left in the cgroup.
func (g *cgroup) populated() bool {
	data, err := os.ReadFile(filepath.Join(g.dir, "cgroup.events"))
	return err == nil && strings.Contains(string(data), "populated 1")
}

// release kills what is left in the cgroup and removes it once it is
// empty (the killed processes have exited), waiting up to
// cgroupRemoveTimeout.
func (g *cgroup) release() error {
	if err := g.kill(); err != nil && !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	deadline := time.Now().Add(cgroupRemoveTimeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err := syscall.Rmdir(g.dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", g.dir, err)
		}
		time.Sleep(pause)
	}
}
