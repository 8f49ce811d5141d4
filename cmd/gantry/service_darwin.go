package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// launchd installs services as daemons under /Library/LaunchDaemons.
type launchd struct{ dir string }

func newServiceManager() (serviceManager, error) { return launchd{dir: "/Library/LaunchDaemons"}, nil }

func (m launchd) plist(name string) string { return filepath.Join(m.dir, launchdLabel(name)+".plist") }

func (m launchd) install(s serviceSpec) error {
	if _, err := os.Stat(m.plist(s.Name)); err == nil {
		return fmt.Errorf("%s exists: uninstall first", m.plist(s.Name))
	}
	if s.LogFile != "" {
		if err := os.MkdirAll(filepath.Dir(s.LogFile), 0o750); err != nil {
			return err
		}
	}
	if err := os.WriteFile(m.plist(s.Name), []byte(launchdPlist(s)), 0o644); err != nil {
		return err
	}
	return launchctl("load", "-w", m.plist(s.Name))
}

func (m launchd) uninstall(name string) error {
	if err := launchctl("unload", "-w", m.plist(name)); err != nil {
		return err
	}
	return os.Remove(m.plist(name))
}

func (launchd) start(name string) error { return launchctl("start", launchdLabel(name)) }
func (launchd) stop(name string) error  { return launchctl("stop", launchdLabel(name)) }

func (launchd) status(name string) (string, error) {
	out, err := exec.Command("launchctl", "list", launchdLabel(name)).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("launchctl list: %w: %s", err, out)
	}
	return string(out), nil
}

// launchctl runs launchctl with args, its output in the error.
func launchctl(args ...string) error {
	if out, err := exec.Command("launchctl", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("launchctl %v: %w: %s", args, err, out)
	}
	return nil
}
