package wire

import (
	"net/url"
	"time"
)

// Route health subjects beyond SubjectHealthPrefix (see names.go).
const (
	// SubjectRouteReportPrefix prefixes the reports of real traffic that
	// failed because of a route: gantry.health.report.<route id>. Workers
	// publish them (core NATS); healthd consumes them so that a route's
	// health reflects real traffic, not only probes.
	SubjectRouteReportPrefix = "gantry.health.report"
	// SubjectRouteReportAll matches every route report.
	SubjectRouteReportAll = SubjectRouteReportPrefix + ".*"

	// SubjectRouteProbe is the endpoint of the "gantry-health" service:
	// healthd probes one route now (`gantry route probe ID`). Request:
	// RouteProbeRequest; reply: RouteProbeReply; a route healthd does not
	// probe is a 404.
	SubjectRouteProbe = "gantry.api.route.probe"

	// HealthServiceName is the micro service healthd registers (`nats micro
	// ls`).
	HealthServiceName = "gantry-health"
)

// RouteReportSubject returns the subject a failure of real traffic through
// route is reported on.
func RouteReportSubject(route string) string { return SubjectRouteReportPrefix + "." + route }

// RouteDirect is the proxy value of a route that goes out without a proxy.
const RouteDirect = "direct"

// RouteAuto is the route an http task names to take the best-scoring
// AVAILABLE route.
const RouteAuto = "auto"

// ProbeStage names one of the three stages of a route probe.
type ProbeStage string

// The probe stages, in order.
const (
	// StageTCP is the TCP connect to the proxy (or to the target when the
	// route is direct).
	StageTCP ProbeStage = "tcp"
	// StageRequest is the light request to the probe URL through the route.
	StageRequest ProbeStage = "request"
	// StageExit is the check of the exit IP / region against what the
	// expect URL reports.
	StageExit ProbeStage = "exit"
)

// ErrorKind classifies why a probe or a request through a route failed.
type ErrorKind string

// The error kinds.
const (
	// KindRefused: the connection was refused or reset.
	KindRefused ErrorKind = "refused"
	// KindTimeout: a connect, handshake or response did not come in time.
	KindTimeout ErrorKind = "timeout"
	// KindBadStatus: the probe URL answered with a 4xx or 5xx status.
	KindBadStatus ErrorKind = "bad_status"
	// KindWrongExit: the exit IP or region is not the expected one.
	KindWrongExit ErrorKind = "wrong_exit"
	// KindProxy: the proxy refused to open the tunnel (CONNECT or SOCKS5
	// reply not a success).
	KindProxy ErrorKind = "proxy"
	// KindOther: any other error (DNS, TLS, a malformed answer).
	KindOther ErrorKind = "other"
)

// HealthResult is the outcome of one probe of a route, published by healthd
// on HealthSubject(route) after every probe; anyone may subscribe
// (`nats sub 'gantry.health.route.>'`).
type HealthResult struct {
	Route string    `json:"route"`
	Time  time.Time `json:"time"`
	OK    bool      `json:"ok"`
	// Stage is the stage that failed; empty when OK.
	Stage ProbeStage `json:"stage,omitempty"`
	// Kind classifies the failure; empty when OK.
	Kind  ErrorKind `json:"kind,omitempty"`
	Error string    `json:"error,omitempty"`
	// LatencyMS is the time the probe request took through the route.
	LatencyMS int64 `json:"latency_ms"`
	// ExitIP and Region are what the expect URL reported, when checked.
	ExitIP string `json:"exit_ip,omitempty"`
	Region string `json:"region,omitempty"`
	// State and Score are the route's after this result.
	State RouteState `json:"state"`
	Score float64    `json:"score"`
}

// RouteReport is a failure of real traffic through a route, published by a
// worker on RouteReportSubject(route) and consumed by healthd, which counts
// it like a failed probe.
type RouteReport struct {
	Route string    `json:"route"`
	Time  time.Time `json:"time"`
	Kind  ErrorKind `json:"kind"`
	Error string    `json:"error,omitempty"`
	// TaskID is the task whose request failed, when known.
	TaskID string `json:"task_id,omitempty"`
}

// RouteProbeRequest asks healthd, on SubjectRouteProbe, to probe a route now.
type RouteProbeRequest struct {
	ID string `json:"id"`
	// Apply records the probe's outcome like a scheduled probe's: a
	// success ends a cooldown, a failure counts and may start or lengthen
	// one. Without it the probe only reports, and the route's state and
	// its probe schedule stay as they were.
	Apply bool `json:"apply,omitempty"`
}

// RouteProbeReply is healthd's answer to a RouteProbeRequest: a probe ran.
// Why none ran is the answer's error (see docs/protocol.md).
type RouteProbeReply struct {
	// Result is the probe's outcome.
	Result *HealthResult `json:"result,omitempty"`
	// Route is the route's state after the probe.
	Route *Route `json:"route,omitempty"`
}

// RedactProxy returns a route's proxy URL with its password replaced, for
// printing and logging. A value that does not parse is replaced whole.
func RedactProxy(proxy string) string {
	if proxy == "" || proxy == RouteDirect {
		return proxy
	}
	u, err := url.Parse(proxy)
	if err != nil {
		return Redacted
	}
	return u.Redacted()
}
