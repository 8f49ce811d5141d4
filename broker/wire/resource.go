package wire

import (
	"fmt"
	"time"
)

// Lease is a holder's claim on a resource: the value of the resource's key
// in BucketLeases. The broker's per-key TTL, not a clock comparison, decides
// when it lapses; ExpiresAt is informative.
type Lease struct {
	Resource  string    `json:"resource"`
	Owner     string    `json:"owner"`
	ExpiresAt time.Time `json:"expires_at"`
	// Revision is the KV revision the lease was last written at; renew and
	// release compare-and-swap on it. It is not stored in the value.
	Revision uint64 `json:"revision"`
}

// ResourceState is where a resource is in its state machine.
type ResourceState string

// The resource states of the contract.
const (
	ResourceAvailable ResourceState = "AVAILABLE"
	ResourceLeased    ResourceState = "LEASED"
	ResourceRunning   ResourceState = "RUNNING"
	ResourceCooldown  ResourceState = "COOLDOWN"
	ResourceFault     ResourceState = "FAULT"
	ResourceDisabled  ResourceState = "DISABLED"
)

// ResourceStates lists every resource state.
var ResourceStates = []ResourceState{
	ResourceAvailable, ResourceLeased, ResourceRunning,
	ResourceCooldown, ResourceFault, ResourceDisabled,
}

// ParseResourceState returns the state named s (upper case).
func ParseResourceState(s string) (ResourceState, error) {
	for _, st := range ResourceStates {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown resource state %q (want one of %v)", s, ResourceStates)
}

// Resource is the value of a resource's key in BucketResources, written by
// the kv resource store (workers, the CLI, reclaim) and read by everyone.
type Resource struct {
	ID         string        `json:"id"`
	State      ResourceState `json:"state"`
	LeaseOwner string        `json:"lease_owner,omitempty"`
	LeaseUntil *time.Time    `json:"lease_until,omitempty"`
	RouteID    string        `json:"route_id,omitempty"`
	LastError  string        `json:"last_error,omitempty"`
	UpdatedAt  time.Time     `json:"updated_at"`
}

// RouteState is the health state of an egress route.
type RouteState string

// The route states of the contract.
const (
	RouteAvailable RouteState = "AVAILABLE"
	RouteCooldown  RouteState = "COOLDOWN"
	RouteFault     RouteState = "FAULT"
	RouteDisabled  RouteState = "DISABLED"
)

// Route is the value of a route's key in BucketRoutes, written by healthd and
// read by workers (to pick a route) and `gantry route ls`.
type Route struct {
	ID                   string     `json:"id"`
	State                RouteState `json:"state"`
	Score                float64    `json:"score"`
	LatencyMS            int64      `json:"latency_ms"`
	ConsecutiveSuccesses int        `json:"consecutive_successes"`
	ConsecutiveFailures  int        `json:"consecutive_failures"`
	LastError            string     `json:"last_error,omitempty"`
	CooldownUntil        *time.Time `json:"cooldown_until,omitempty"`
	LastChecked          *time.Time `json:"last_checked,omitempty"`

	// Proxy is the route's proxy URL (http:// or socks5://) or "direct",
	// copied from the config by healthd so that a worker on any machine can
	// go out through the route. It may hold credentials: print it through
	// RedactProxy.
	Proxy string `json:"proxy,omitempty"`
	// RecentTimeouts counts the timeouts within healthd's timeout window;
	// TimeoutTimes holds when they happened.
	RecentTimeouts int         `json:"recent_timeouts"`
	TimeoutTimes   []time.Time `json:"timeout_times,omitempty"`
	// LastErrorKind classifies LastError.
	LastErrorKind ErrorKind `json:"last_error_kind,omitempty"`
	// CooldownStreak counts the cooldowns in a row without the route
	// settling; each one lasts longer than the last.
	CooldownStreak int `json:"cooldown_streak,omitempty"`
}
