package client

import (
	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/lease"
)

// The types the client's calls take and return, so that a Go program needs
// one import. They are the contract's (package broker/wire) and the lease
// package's own.
type (
	// TaskRecord is what gantry knows of a task: its state, attempts,
	// last error and output tail.
	TaskRecord = wire.TaskRecord
	// TaskState is where a task is in its life.
	TaskState = wire.TaskState
	// NoopPayload is the payload of the built-in type noop.
	NoopPayload = wire.NoopPayload
	// ExecPayload is the payload of the built-in type exec.
	ExecPayload = wire.ExecPayload
	// HTTPPayload is the payload of the built-in type http.
	HTTPPayload = wire.HTTPPayload

	// Lease is an exclusive claim on a resource.
	Lease = wire.Lease
	// Resource is a registered resource and its state.
	Resource = lease.Resource
	// ResourceSpec registers a resource.
	ResourceSpec = lease.ResourceSpec
	// ResourceState is a state of the resource state machine.
	ResourceState = wire.ResourceState
	// ResourceHolder is a held lease, renewed in the background; its
	// Context ends when the lease is lost.
	ResourceHolder = lease.ResourceHolder
	// Outcome is how the work under a ResourceHolder ended, for its
	// Finish: the zero value returns the resource to AVAILABLE.
	Outcome = lease.Outcome
	// WaitStatus is what a lease waiting in line sees: the holder and its
	// expiry, the resource's state, its place in line.
	WaitStatus = lease.WaitStatus

	// Job is a scheduled job's definition.
	Job = wire.Job
	// JobRun is one fire of a job and what became of it.
	JobRun = wire.JobRun

	// Route is an egress route's health.
	Route = wire.Route
	// RouteProbe is the outcome of a probe healthd ran on request, and
	// the route's state after it.
	RouteProbe = wire.RouteProbeReply

	// Event is an audit event.
	Event = wire.Event
	// AuditQuery filters the audit store; every field is optional.
	AuditQuery = wire.AuditQuery
	// AuditPage is one page of a query's events, oldest first.
	AuditPage = wire.AuditPage
	// AuditStats is what auditd has done since it started.
	AuditStats = wire.AuditStats
	// AuditBackup describes a fetched audit store backup.
	AuditBackup = wire.AuditBackupReply
)

// The task states.
const (
	TaskWaiting     = wire.TaskWaiting
	TaskRunning     = wire.TaskRunning
	TaskRetryWait   = wire.TaskRetryWait
	TaskSucceeded   = wire.TaskSucceeded
	TaskNeedsReview = wire.TaskNeedsReview
	TaskCancelled   = wire.TaskCancelled
)
