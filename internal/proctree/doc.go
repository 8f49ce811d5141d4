// Package proctree runs a command as a process tree: the command's process
// and every process it starts, signalled, terminated and killed as a whole.
// It is the one place gantry starts a process that must not outlive its
// task: exec tasks in workers and `gantry lease run` both go through a
// Starter.
//
// The command's own exit is what matters. When it exits, Wait kills what is
// left of its tree, so a background child that inherited its output pipes
// does not keep Wait waiting; Start copies any standard stream that is not
// a file through a pipe of its own to make that so. A command made by
// exec.CommandContext is terminated when its context ends (SIGTERM to the
// tree; CTRL_BREAK on Windows) and killed as a whole WaitDelay later, or
// killed at once without a WaitDelay. A command that cannot start (its
// program missing or not executable, its dir missing) is an error of
// Start, and nothing runs.
//
// # Containment
//
// New chooses once, per Starter, how trees are held together:
//
//   - Cgroup (Linux): each tree gets a cgroup v2 of its own, made in the
//     cgroup gantry runs in when that cgroup is delegated to it (a unit
//     with Delegate=yes, which systemd 251 and later marks with a
//     delegate xattr; or the root of a container's cgroup namespace) and
//     writable. The command is started inside it
//     (CLONE_INTO_CGROUP), every descendant is born inside it and none can
//     leave it, and cgroup.kill kills them all at once, whatever they did
//     (setsid, double fork). The cgroup is removed once it is empty. If
//     gantry is killed with SIGKILL the command dies with it (a parent-death
//     signal), and what it started is killed when a Starter is next made in
//     the same cgroup.
//   - Subreaper (Linux): each tree runs under a shim, gantry's own
//     executable re-run with ShimMain's argument, which makes itself the
//     child subreaper (PR_SET_CHILD_SUBREAPER) of the command it starts. A
//     descendant whose parent exits is re-parented to the shim rather than
//     to init, so the shim finds every descendant below it in /proc and
//     kills them: when the command exits, when gantry asks, and when gantry
//     dies (gantry's end of their socket closes). The shim costs one small
//     process per tree.
//   - Group (Unix; the only one on macOS and the BSDs): the command leads a
//     process group (Setpgid), and on Linux has a parent-death signal
//     (SIGKILL). A descendant that leaves the group (setsid, setpgid)
//     escapes it; if it holds the output, Wait cuts the output off
//     WaitDelay after the command exits. On macOS and the BSDs a gantry
//     killed with SIGKILL leaves the command running. On Windows, Group is
//     a Job Object with kill-on-close, and the command leads a console
//     process group of its own, which CTRL_BREAK addresses; the job holds
//     every descendant and dies with gantry, but it is assigned just after
//     the process starts, so a child started in that instant escapes it.
//
// Auto takes Cgroup where the machine allows it, else Subreaper when a shim
// is configured, else Group. Why a shim rather than gantry as the
// subreaper: a subreaper inherits the orphans of every tree it runs and
// must reap them, which in a process running many trees at once races
// exec.Cmd's own wait on its children and cannot tell which tree an orphan
// came from; a shim is the subreaper of one tree only. A PID namespace per
// tree would also contain it, but needs privileges or user namespaces,
// which desktops often restrict, and makes the command PID 1, which
// changes its signal handling.
//
// What no containment holds: a process the tree has another service start
// (systemd-run, at, a D-Bus activation) is not its descendant.
package proctree
