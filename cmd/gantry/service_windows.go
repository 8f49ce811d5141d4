package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/eventlog"
	"golang.org/x/sys/windows/svc/mgr"
)

// scm installs services in the Windows Service Control Manager.
type scm struct{}

func newServiceManager() (serviceManager, error) { return scm{}, nil }

// connect opens the SCM and, unless name is empty, the service.
func connectSCM(name string) (*mgr.Mgr, *mgr.Service, error) {
	m, err := mgr.Connect()
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the service control manager (run as administrator): %w", err)
	}
	if name == "" {
		return m, nil, nil
	}
	s, err := m.OpenService(name)
	if err != nil {
		_ = m.Disconnect()
		return nil, nil, fmt.Errorf("open service: %w", err)
	}
	return m, s, nil
}

func (scm) install(spec serviceSpec) error {
	ws := windowsServiceOf(spec)
	m, _, err := connectSCM("")
	if err != nil {
		return err
	}
	defer func() { _ = m.Disconnect() }()
	if s, err := m.OpenService(ws.Name); err == nil {
		s.Close()
		return fmt.Errorf("service %s exists: uninstall first", ws.Name)
	}
	start := uint32(mgr.StartManual)
	if ws.StartAutomatic {
		start = mgr.StartAutomatic
	}
	s, err := m.CreateService(ws.Name, ws.Exe, mgr.Config{DisplayName: ws.DisplayName, Description: ws.Description,
		StartType: start}, ws.Args...)
	if err != nil {
		return err
	}
	defer s.Close()
	actions := make([]mgr.RecoveryAction, 0, len(ws.RestartDelays))
	for _, d := range ws.RestartDelays {
		actions = append(actions, mgr.RecoveryAction{Type: mgr.ServiceRestart, Delay: d})
	}
	if err := s.SetRecoveryActions(actions, uint32(ws.ResetPeriod/time.Second)); err != nil {
		_ = s.Delete()
		return fmt.Errorf("recovery actions: %w", err)
	}
	if err := eventlog.InstallAsEventCreate(ws.Name, eventlog.Error|eventlog.Warning|eventlog.Info); err != nil &&
		!strings.Contains(err.Error(), "exists") {
		_ = s.Delete()
		return fmt.Errorf("event log source: %w", err)
	}
	return nil
}

func (scm) uninstall(name string) error {
	m, s, err := connectSCM(name)
	if err != nil {
		return err
	}
	defer func() { _ = m.Disconnect() }()
	defer s.Close()
	if st, err := s.Query(); err == nil && st.State != svc.Stopped {
		_ = stopService(s)
	}
	if err := s.Delete(); err != nil {
		return err
	}
	_ = eventlog.Remove(name)
	return nil
}

func (scm) start(name string) error {
	m, s, err := connectSCM(name)
	if err != nil {
		return err
	}
	defer func() { _ = m.Disconnect() }()
	defer s.Close()
	return s.Start()
}

func (scm) stop(name string) error {
	m, s, err := connectSCM(name)
	if err != nil {
		return err
	}
	defer func() { _ = m.Disconnect() }()
	defer s.Close()
	return stopService(s)
}

// stopService asks s to stop and waits until it has, within the stop
// timeout.
func stopService(s *mgr.Service) error {
	st, err := s.Control(svc.Stop)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(serviceStopTimeout)
	for st.State != svc.Stopped {
		if time.Now().After(deadline) {
			return fmt.Errorf("still %d after %s", st.State, serviceStopTimeout)
		}
		time.Sleep(250 * time.Millisecond)
		if st, err = s.Query(); err != nil {
			return err
		}
	}
	return nil
}

func (scm) status(name string) (string, error) {
	m, s, err := connectSCM(name)
	if err != nil {
		return "", err
	}
	defer func() { _ = m.Disconnect() }()
	defer s.Close()
	st, err := s.Query()
	if err != nil {
		return "", err
	}
	states := map[svc.State]string{svc.Stopped: "stopped", svc.StartPending: "starting", svc.StopPending: "stopping",
		svc.Running: "running", svc.ContinuePending: "continuing", svc.PausePending: "pausing", svc.Paused: "paused"}
	return fmt.Sprintf("%s: %s (pid %d)", name, states[st.State], st.ProcessId), nil
}

// runService runs gantry args as the Windows service name: it answers the
// SCM, stops gantry (as SIGTERM would) on a stop or shutdown request, and
// reports start, stop and failure to the event log. Outside the SCM it
// runs in the foreground.
func runService(ctx context.Context, name, logFile string, args []string) error {
	isService, err := svc.IsWindowsService()
	if err != nil || !isService {
		return runServiceForeground(ctx, logFile, args)
	}
	elog, err := eventlog.Open(name)
	if err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	defer elog.Close()
	h := &serviceHandler{ctx: ctx, logFile: logFile, args: args, elog: elog}
	if err := svc.Run(name, h); err != nil {
		_ = elog.Error(1, fmt.Sprintf("gantry service %s: %v", name, err))
		return err
	}
	return h.err
}

// serviceHandler is gantry under the SCM.
type serviceHandler struct {
	ctx     context.Context
	logFile string
	args    []string
	elog    *eventlog.Log
	err     error
}

// Execute runs gantry until it ends or the SCM asks it to stop.
func (h *serviceHandler) Execute(_ []string, req <-chan svc.ChangeRequest, status chan<- svc.Status) (bool, uint32) {
	status <- svc.Status{State: svc.StartPending}
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runServiceForeground(ctx, h.logFile, h.args) }()
	status <- svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown}
	_ = h.elog.Info(1, "gantry started: gantry "+strings.Join(h.args, " "))
	for {
		select {
		case err := <-done:
			h.err = err
			if err != nil {
				_ = h.elog.Error(1, "gantry stopped: "+err.Error())
				return true, 1
			}
			_ = h.elog.Info(1, "gantry stopped")
			return false, 0
		case c := <-req:
			switch c.Cmd {
			case svc.Interrogate:
				status <- c.CurrentStatus
			case svc.Stop, svc.Shutdown:
				status <- svc.Status{State: svc.StopPending, WaitHint: uint32(serviceStopTimeout / time.Millisecond)}
				cancel()
			}
		}
	}
}
