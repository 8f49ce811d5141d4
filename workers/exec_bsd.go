//go:build unix && !linux

package workers

import "syscall"

// setParentDeathSignal does nothing where the kernel has no parent death
// signal (macOS, BSD): there a killed worker can leave its task's
// processes running.
func setParentDeathSignal(*syscall.SysProcAttr) {}
