// Package proctree runs a command as a process tree: the command's process
// and every process it starts, signalled, terminated and killed as a whole.
// It is the one place gantry starts a process that must not outlive its
// task: exec tasks in workers and `gantry lease run` both go through it.
//
// On Unix the tree is a process group the command leads (Setpgid); on Linux
// the command also has a parent-death signal (SIGKILL), so that gantry
// killed with SIGKILL takes the command along. On Windows the tree is a Job
// Object with kill-on-close, and the command leads a console process group
// of its own, which CTRL_BREAK addresses.
//
// The command's own exit is what matters. When it exits, Wait kills what is
// left of its tree, so a background child that inherited its output pipes
// does not keep Wait waiting; Start copies any standard stream that is not
// a file through a pipe of its own to make that so. A command made by
// exec.CommandContext is terminated when its context ends (SIGTERM to the
// group; CTRL_BREAK on Windows) and killed as a whole WaitDelay later, or
// killed at once without a WaitDelay.
//
// What the tree does not hold: on Unix a descendant that leaves the process
// group (setsid, setpgid) is out of reach, and the parent-death signal
// reaches only the command itself, not its children. On Windows the job is
// assigned just after the process starts, so a child started in that
// instant escapes it. Stronger containment (a child subreaper, a cgroup v2
// scope) belongs behind the same Start, Signal, Kill and Wait.
package proctree
