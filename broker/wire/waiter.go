package wire

import (
	"strings"
	"time"
)

// Waiter is one place in the line for a busy (or DISABLED, or FAULT)
// resource: the value of the key <resource>.<ticket> in BucketWaiters,
// written with a per-key TTL that its waiter renews while it waits, so that
// a dead waiter's place lapses. The lease package writes it for a task
// waiting for its resource and for `gantry lease acquire|run --wait`; every
// waiter of the resource reads the line to know whether it is next, and
// `gantry resource ls|get` counts it.
//
// The line is ordered by Priority (higher first), then Arrived (earlier
// first), then Seq, then the key.
type Waiter struct {
	Resource string `json:"resource"`
	// Owner is who takes the lease when this waiter's turn comes.
	Owner string `json:"owner"`
	// TaskID is the task waiting, if a task is.
	TaskID string `json:"task_id,omitempty"`
	// Priority is the task's priority on a prioritized queue; 0 otherwise.
	Priority int `json:"priority"`
	// Arrived is when the waiter arrived: for a task, when it was published
	// (the broker's time); otherwise the broker's time of the ticket's first
	// write, which leaves it out (readers then take that write's time).
	Arrived *time.Time `json:"arrived,omitempty"`
	// Seq breaks ties between equal Arrived: a task's stream sequence.
	Seq uint64 `json:"seq,omitempty"`
	// TTL is the ticket's TTL (a Go duration); ExpiresAt is when it lapses
	// unless renewed (informative: the broker's TTL decides).
	TTL       string    `json:"ttl"`
	ExpiresAt time.Time `json:"expires_at"`
}

// WaiterKey returns the key of ticket in the line for resource.
func WaiterKey(resource, ticket string) string { return resource + "." + ticket }

// WaiterResource returns the resource of a key of BucketWaiters, or false
// if key is not <resource>.<ticket>.
func WaiterResource(key string) (string, bool) {
	res, ticket, ok := strings.Cut(key, ".")
	return res, ok && res != "" && ticket != ""
}

// EventResourceWaiting records that a task or a `--wait` took its place in
// the line for a busy, DISABLED or FAULT resource, on
// gantry.audit.resource.waiting, with the waiter, the holder and its expiry.
// The lease package publishes it.
const EventResourceWaiting EventType = "RESOURCE_WAITING"
