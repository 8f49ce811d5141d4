package lease

import (
	"fmt"
	"sync"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
)

// DefaultConflictWindow is LeasesConfig.ConflictWindow unless set.
const DefaultConflictWindow = 10 * time.Second

// conflicts coalesces LEASE_CONFLICT events per (resource, owner): the
// first conflict of a window is recorded at once; those after it in the
// window are counted, and the count goes out with the first conflict after
// the window, with the owner's acquire of the resource, or at Flush. A
// contender polling a held resource so makes one event a window, not one a
// poll, and no conflict goes uncounted.
type conflicts struct {
	clock  clock.Clock
	window time.Duration

	mu sync.Mutex
	m  map[conflictKey]*conflictTally
}

type conflictKey struct{ resource, owner string }

// conflictTally is what one owner met on one resource since its last
// event.
type conflictTally struct {
	// reported is when the last event went out.
	reported time.Time
	// count conflicts are not reported yet, the first at since; cur is
	// the lease the last one met.
	count int
	since time.Time
	cur   wire.Lease
}

// maxTallies bounds the tallies kept before the settled ones are pruned.
const maxTallies = 4096

func newConflicts(clk clock.Clock, window time.Duration) *conflicts {
	return &conflicts{clock: clk, window: window, m: map[conflictKey]*conflictTally{}}
}

// note records that owner found resource held as cur, and returns the
// event to emit now, if any.
func (c *conflicts) note(resource, owner string, cur wire.Lease) (wire.Event, bool) {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	k := conflictKey{resource, owner}
	t := c.m[k]
	if t == nil {
		if len(c.m) >= maxTallies {
			c.prune(now)
		}
		t = &conflictTally{}
		c.m[k] = t
	}
	if t.count == 0 {
		t.since = now
	}
	t.count++
	t.cur = cur
	if !t.reported.IsZero() && now.Sub(t.reported) < c.window {
		return wire.Event{}, false
	}
	return c.report(k, t, now), true
}

// take returns the event of owner's conflicts on resource not yet
// reported, if any, and forgets them: the owner has acquired it.
func (c *conflicts) take(resource, owner string) (wire.Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := conflictKey{resource, owner}
	t := c.m[k]
	if t == nil {
		return wire.Event{}, false
	}
	delete(c.m, k)
	if t.count == 0 {
		return wire.Event{}, false
	}
	return c.report(k, t, c.clock.Now()), true
}

// takeAll returns the events of every count not yet reported.
func (c *conflicts) takeAll() []wire.Event {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []wire.Event
	for k, t := range c.m {
		if t.count > 0 {
			out = append(out, c.report(k, t, now))
		}
	}
	return out
}

// prune forgets the tallies with nothing to report whose window is over.
func (c *conflicts) prune(now time.Time) {
	for k, t := range c.m {
		if t.count == 0 && now.Sub(t.reported) >= c.window {
			delete(c.m, k)
		}
	}
}

// report builds the event of t's count and starts a new window.
func (c *conflicts) report(k conflictKey, t *conflictTally, now time.Time) wire.Event {
	msg := fmt.Sprintf("%s wanted %s, held by %s", k.owner, k.resource, t.cur.Owner)
	if t.count > 1 {
		msg += fmt.Sprintf(" (%d times since %s)", t.count, t.since.UTC().Format(time.RFC3339))
	}
	ev := wire.Event{
		Type: wire.EventLeaseConflict, ResourceID: k.resource, Level: wire.LevelWarn, Message: msg,
		Payload: audit.Payload(map[string]any{"owner": k.owner, "holder": t.cur.Owner, "expires_at": t.cur.ExpiresAt,
			"revision": t.cur.Revision, "count": t.count, "since": t.since}),
	}
	t.reported, t.count = now, 0
	return ev
}
