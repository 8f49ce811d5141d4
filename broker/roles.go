package broker

import (
	"fmt"
	"slices"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Role names what a user may do; its Permissions say it subject by subject.
// A component running as its role can do its job and nothing else.
type Role string

// The roles. docs/deployment.md tables what each allows.
const (
	// RoleOperator may do everything: the CLI of whoever runs the system.
	RoleOperator Role = "operator"
	// RoleWorker runs 'gantry worker': its queues' consumers, task
	// records, checkpoints, leases and resources, and its events.
	RoleWorker Role = "worker"
	// RoleScheduler runs 'gantry scheduler': jobs, scheduler state, task
	// publishing, and its events.
	RoleScheduler Role = "scheduler"
	// RoleHealthd runs 'gantry healthd': routes, route health, and its
	// events.
	RoleHealthd Role = "healthd"
	// RoleAuditd runs 'gantry auditd': the audit stream's consumer and the
	// audit service.
	RoleAuditd Role = "auditd"
	// RoleAlertd runs 'gantry alertd': it reads what the others write (the
	// audit stream through a durable consumer, workers, routes, resources,
	// the scheduler's leader) and publishes alert events.
	RoleAlertd Role = "alertd"
	// RoleSubmitter publishes tasks and reads their state ('gantry submit
	// --publish-only', 'gantry task get|ls'); it writes no task record, so
	// it cannot cancel or relabel a task.
	RoleSubmitter Role = "submitter"
	// RoleViewer reads: tasks, leases, resources, jobs, routes, the audit
	// trail and its queries.
	RoleViewer Role = "viewer"
	// RoleLeaf is the user a leaf broker (gantry run --leaf) attaches to a
	// hub with: JetStream traffic between the domains (the hub sourcing
	// the leaf's audit stream), never gantry's own subjects.
	RoleLeaf Role = "leaf"
)

// Roles lists every role, in the order the docs table them.
var Roles = []Role{RoleOperator, RoleWorker, RoleScheduler, RoleHealthd, RoleAuditd, RoleAlertd, RoleSubmitter, RoleViewer, RoleLeaf}

// Permissions are the subjects a role may publish and subscribe to. Allow
// lists are exhaustive when set; Deny lists take away from them (or from
// everything when Allow is empty). Responses lets the role answer the
// requests it receives (its services) without a publish right on reply
// subjects.
type Permissions struct {
	PublishAllow, PublishDeny     []string
	SubscribeAllow, SubscribeDeny []string
	Responses                     bool
}

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !slices.Contains(Roles, r) {
		return "", fmt.Errorf("unknown role %q (want one of %v)", s, Roles)
	}
	return r, nil
}

// JetStream API and internal subjects the permissions are built from.
const (
	jsAPI      = "$JS.API."
	jsInfo     = jsAPI + "INFO"
	srvAll     = "$SRV.>"
	inboxAll   = "_INBOX.>"
	kvPrefix   = "$KV."
	objPrefix  = "$O."
	advisories = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + wire.StreamTasks + ".>"
	elections  = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED." + wire.StreamTasks + ".>"
)

// kvStream is the stream behind bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// streamRead is what reading stream s takes: its info, getting messages,
// and ordered or durable consumers that read it (a KV watch is one).
func streamRead(s string) []string {
	return []string{
		jsAPI + "STREAM.INFO." + s,
		jsAPI + "STREAM.MSG.GET." + s,
		jsAPI + "DIRECT.GET." + s, jsAPI + "DIRECT.GET." + s + ".>",
		jsAPI + "CONSUMER.CREATE." + s, jsAPI + "CONSUMER.CREATE." + s + ".>",
		jsAPI + "CONSUMER.DURABLE.CREATE." + s + ".>",
		jsAPI + "CONSUMER.INFO." + s + ".>",
		jsAPI + "CONSUMER.DELETE." + s + ".>",
		jsAPI + "CONSUMER.MSG.NEXT." + s + ".>",
		"$JS.FC." + s + ".>", "$JS.FC.*.*." + s + ".>",
	}
}

// streamConsume is streamRead plus acknowledging, listing and removing
// consumers and messages: a work queue's or a durable consumer's owner.
func streamConsume(s string) []string {
	return append(streamRead(s),
		jsAPI+"CONSUMER.NAMES."+s, jsAPI+"CONSUMER.LIST."+s,
		jsAPI+"STREAM.MSG.DELETE."+s,
		"$JS.ACK."+s+".>", "$JS.ACK.*.*."+s+".>")
}

// kvRead is what reading and watching bucket takes.
func kvRead(bucket string) []string { return streamRead(kvStream(bucket)) }

// kvWrite is what reading and writing bucket takes.
func kvWrite(bucket string) []string { return append(kvRead(bucket), kvPrefix+bucket+".>") }

// events is the right to publish audit events of the given kinds
// (gantry.audit.<kind>.>).
func events(kinds ...string) []string {
	out := make([]string, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, wire.SubjectAuditPrefix+"."+k+".>")
	}
	return out
}

// readAll is what reading everything takes: every bucket, the streams'
// info, the audit stream (tail), service discovery, the audit queries and
// a running task's recent output.
func readAll() []string {
	p := []string{jsInfo, jsAPI + "STREAM.NAMES", jsAPI + "STREAM.LIST",
		jsAPI + "STREAM.INFO." + wire.StreamTasks, jsAPI + "CONSUMER.INFO." + wire.StreamTasks + ".>",
		jsAPI + "CONSUMER.NAMES." + wire.StreamTasks, jsAPI + "CONSUMER.LIST." + wire.StreamTasks,
		wire.SubjectAuditQuery, wire.SubjectAuditStats, wire.SubjectTaskOutput, wire.SubjectBrokerHealth,
		"$SRV.PING", "$SRV.PING.>", "$SRV.INFO", "$SRV.INFO.>", "$SRV.STATS", "$SRV.STATS.>"}
	p = append(p, streamRead(wire.StreamAudit)...)
	for _, b := range wire.Buckets {
		p = append(p, kvRead(b)...)
	}
	return p
}

// readSubscribe is what a reader subscribes to: its replies, and the live
// audit, health and task output subjects.
var readSubscribe = []string{inboxAll, wire.SubjectAuditAll, wire.SubjectHealthAll, wire.SubjectOutputAll}

// RolePermissions returns the permissions of r.
func RolePermissions(r Role) (Permissions, error) {
	switch r {
	case RoleOperator:
		return Permissions{PublishAllow: []string{">"}, SubscribeAllow: []string{">"}}, nil
	case RoleWorker:
		pub := []string{jsInfo, wire.SubjectTasksAll, wire.SubjectReadyAll, wire.SubjectOutputAll,
			wire.SubjectHandlersPrefix + ".>", wire.SubjectRouteReportPrefix + ".>"}
		pub = append(pub, streamConsume(wire.StreamTasks)...)
		pub = append(pub, kvWrite(wire.BucketTasks)...)
		pub = append(pub, kvWrite(wire.BucketCheckpoints)...)
		pub = append(pub, kvWrite(wire.BucketLeases)...)
		pub = append(pub, kvWrite(wire.BucketResources)...)
		pub = append(pub, kvWrite(wire.BucketWaiters)...)
		pub = append(pub, kvWrite(wire.BucketWorkers)...)
		pub = append(pub, kvRead(wire.BucketQueues)...)
		pub = append(pub, kvRead(wire.BucketRoutes)...)
		pub = append(pub, jsAPI+"CONSUMER.PAUSE."+wire.StreamTasks+".>")
		// A NEEDS_REVIEW task's message is kept on its review subject; a
		// tasks stream deleted behind its back is created again as
		// provisioned.
		pub = append(pub, wire.SubjectReviewAll, jsAPI+"STREAM.CREATE."+wire.StreamTasks)
		pub = append(pub, events("task", "resource", "kv")...)
		return Permissions{PublishAllow: pub,
			SubscribeAllow: []string{inboxAll, wire.SubjectTaskCancel, wire.SubjectTaskOutput, advisories, elections, srvAll},
			Responses:      true}, nil
	case RoleScheduler:
		pub := []string{jsInfo, wire.SubjectTasksAll, wire.SubjectTaskCancel,
			jsAPI + "STREAM.INFO." + wire.StreamTasks}
		pub = append(pub, kvWrite(wire.BucketJobs)...)
		pub = append(pub, kvWrite(wire.BucketScheduler)...)
		pub = append(pub, kvRead(wire.BucketTasks)...)
		pub = append(pub, streamRead(wire.StreamAudit)...)
		pub = append(pub, events("job", "scheduler", "config", "kv")...)
		return Permissions{PublishAllow: pub,
			SubscribeAllow: []string{inboxAll, wire.SubjectSchedulerTrigger, srvAll},
			Responses:      true}, nil
	case RoleHealthd:
		pub := []string{jsInfo, wire.SubjectHealthAll}
		pub = append(pub, kvWrite(wire.BucketRoutes)...)
		pub = append(pub, events("route", "config", "kv")...)
		return Permissions{PublishAllow: pub,
			SubscribeAllow: []string{inboxAll, wire.SubjectRouteReportAll, wire.SubjectRouteProbe, srvAll},
			Responses:      true}, nil
	case RoleAuditd:
		obj := "OBJ_" + wire.BucketAuditBackups
		pub := []string{jsInfo, objPrefix + wire.BucketAuditBackups + ".>",
			jsAPI + "STREAM.CREATE." + obj, jsAPI + "STREAM.UPDATE." + obj, jsAPI + "STREAM.PURGE." + obj}
		pub = append(pub, streamConsume(wire.StreamAudit)...)
		// The audit stream deleted behind auditd's back is created again.
		pub = append(pub, jsAPI+"STREAM.CREATE."+wire.StreamAudit)
		pub = append(pub, streamRead(obj)...)
		return Permissions{PublishAllow: pub,
			SubscribeAllow: []string{inboxAll, wire.SubjectAuditQuery, wire.SubjectAuditBackup, wire.SubjectAuditStats, srvAll},
			Responses:      true}, nil
	case RoleAlertd:
		pub := append(readAll(), "$JS.ACK."+wire.StreamAudit+".>", "$JS.ACK.*.*."+wire.StreamAudit+".>")
		pub = append(pub, events("alert")...)
		return Permissions{PublishAllow: pub, SubscribeAllow: readSubscribe}, nil
	case RoleSubmitter:
		return Permissions{PublishAllow: append(readAll(), wire.SubjectTasksAll), SubscribeAllow: readSubscribe}, nil
	case RoleViewer:
		return Permissions{PublishAllow: readAll(), SubscribeAllow: readSubscribe}, nil
	case RoleLeaf:
		deny := append(slices.Clone(leafSeparate), jsAPI+">")
		return Permissions{PublishDeny: deny, SubscribeDeny: deny}, nil
	}
	return Permissions{}, fmt.Errorf("unknown role %q", r)
}
