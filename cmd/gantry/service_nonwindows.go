//go:build !windows

package main

import "context"

// runService runs gantry args as a service manager started it: in the
// foreground, the log appended to logFile when set (systemd and launchd
// stop it with SIGTERM).
func runService(ctx context.Context, _, logFile string, args []string) error {
	return runServiceForeground(ctx, logFile, args)
}
