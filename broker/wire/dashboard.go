package wire

// EventDashboardAction is the event the dashboard publishes for every
// action a person takes on it (retry, cancel, purge, enable, disable,
// probe, trigger, pause, resume), allowed or refused, on
// gantry.audit.dashboard.action. It carries the task, resource, route or
// job acted on; its payload is a DashboardAction, naming the user. The
// action's own events (RETRY_SCHEDULED, TASK_PURGED…) follow as from any
// client, with the component "dashboard".
const EventDashboardAction EventType = "DASHBOARD_ACTION"

// DashboardAction is the payload of a DASHBOARD_ACTION event.
type DashboardAction struct {
	// User is who acted: a user of the config's auth section, or "local"
	// on a dashboard served on loopback without users.
	User string `json:"user"`
	// Role is the user's role.
	Role string `json:"role"`
	// Action names what was asked: task.retry, task.cancel, task.purge,
	// resource.enable, resource.disable, route.probe, job.trigger,
	// job.pause, job.resume.
	Action string `json:"action"`
	// Remote is the address the request came from.
	Remote string `json:"remote,omitempty"`
	// Outcome is "done", "failed" (Error says why) or "refused" (the
	// user's role does not allow the action).
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}
