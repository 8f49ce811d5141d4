package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// systemd installs services as units under /etc/systemd/system.
type systemd struct{ dir string }

func newServiceManager() (serviceManager, error) {
	if _, err := exec.LookPath("systemctl"); err != nil {
		return nil, fmt.Errorf("%w: no systemctl here", errNoServiceManager)
	}
	return systemd{dir: "/etc/systemd/system"}, nil
}

func (m systemd) unit(name string) string { return filepath.Join(m.dir, name+".service") }

func (m systemd) install(s serviceSpec) error {
	if _, err := os.Stat(m.unit(s.Name)); err == nil {
		return fmt.Errorf("%s exists: uninstall first", m.unit(s.Name))
	}
	if err := os.WriteFile(m.unit(s.Name), []byte(systemdUnit(s)), 0o644); err != nil {
		return err
	}
	if err := systemctl("daemon-reload"); err != nil {
		return err
	}
	return systemctl("enable", s.Name)
}

func (m systemd) uninstall(name string) error {
	if err := systemctl("disable", "--now", name); err != nil {
		return err
	}
	if err := os.Remove(m.unit(name)); err != nil {
		return err
	}
	return systemctl("daemon-reload")
}

func (systemd) start(name string) error { return systemctl("start", name) }
func (systemd) stop(name string) error  { return systemctl("stop", name) }

func (systemd) status(name string) (string, error) {
	out, err := exec.Command("systemctl", "status", "--no-pager", name).CombinedOutput()
	if err != nil && len(out) == 0 {
		return "", err
	}
	return string(out), nil
}

// systemctl runs systemctl with args, its output in the error.
func systemctl(args ...string) error {
	if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("systemctl %v: %w: %s", args, err, out)
	}
	return nil
}
