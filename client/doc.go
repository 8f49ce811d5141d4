// Package client is gantry's public Go API: what the gantry CLI and a Go
// program call to submit tasks and wait for them, and to read and change
// tasks, leases, resources, jobs, routes and the audit trail, from any
// machine that reaches the broker.
//
// Connect with the nats CLI's options, or wrap a connection you have with
// New:
//
//	c, err := client.Connect(ctx, client.Options{Servers: "nats://127.0.0.1:4222"})
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//
//	sub, err := c.Submit(ctx, client.Task{
//		Type:    "exec",
//		Payload: client.ExecPayload{Cmd: []string{"./nightly-report.sh"}},
//		Key:     "nightly-report-2026-11-30", // submitted once, however often this runs
//	})
//	if err != nil {
//		return err
//	}
//	rec, err := c.Wait(ctx, sub.ID) // until SUCCEEDED, NEEDS_REVIEW or CANCELLED
//
// The client is the front door; the domain packages are the rooms. Its
// calls build on tasks (records, dedupe keys, tasks.NewMsg, the one builder
// of task messages), lease (leases, resources and their state machine),
// jobs (definitions through jobs.Apply, which keeps an operator's pause)
// and egress (route health), and on the components' NATS services (auditd's
// query and backup, healthd's probe, the leading scheduler's trigger, the
// workers' cancel), which answer by one convention: see internal/rpc and
// docs/protocol.md.
//
// Errors match one vocabulary with errors.Is, whether a store on this
// machine or a service on another returned them: ErrNotFound, ErrInvalid,
// ErrConflict (a *ConflictError names a lease's holder), ErrUnavailable,
// and the few of this package (ErrGaveUp, ErrLeaseLost, ErrIllegalMove,
// ErrMalformedEvent).
//
// Every call is bounded by the client's timeout (WithTimeout) unless its
// context has a deadline, except Wait, HoldLease, TailAudit and a lease
// call that waits in line (WaitInLine), which last as long as their
// context.
package client
