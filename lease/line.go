package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/kv"
)

// A resource that is busy (or DISABLED, or FAULT) has a line: those
// waiting for it each hold a ticket in gantry_waiters, the key
// <resource>.<ticket>, with a per-key TTL they renew every third of it. Each
// waiter follows the resource's lease key, its resource key and its line
// with KV watches (one set per resource per process, shared by the
// process's waiters) and takes the lease as soon as the lease is gone, the
// resource is neither DISABLED nor FAULT and its ticket is first in line:
// a release, an expiry, the end of a cooldown or an enable wakes it at
// once. Nothing is taken over: the lease is still a compare-and-swap, and a
// waiter that loses it (to a caller that did not wait) waits again. A dead
// waiter's ticket lapses after its TTL, and the next one moves up.

// DefaultTicketTTL is how long a waiter's place in line outlives the
// waiter: the waiter renews it every third of it, and the next in line
// waits at most this long for the turn of a waiter that died.
const DefaultTicketTTL = 5 * time.Second

// markerTTL is how long the marker of a ticket given up stays in
// gantry_waiters, as long as the marker of an expired one (the bucket's
// LimitMarkerTTL): watchers see it; the bucket does not grow.
const markerTTL = time.Minute

// removeTimeout bounds giving a ticket up; if it fails, the ticket lapses
// after its TTL.
const removeTimeout = 2 * time.Second

// Place is where a waiter stands in a resource's line: by Priority (higher
// first), then Arrived (earlier first), then Seq.
type Place struct {
	// Priority is a task's priority on a prioritized queue. Defaults to 0.
	Priority int
	// Arrived is when the waiter arrived: a task's publish time (the
	// broker's). Zero: the broker's time of the waiter's first ticket.
	Arrived time.Time
	// Seq breaks ties between equal Arrived: a task's stream sequence.
	Seq uint64
	// TaskID names the task waiting, if one is, for the line's readers and
	// the audit event; Job the job that fired it, for the event.
	TaskID, Job string
}

// WaitOptions tune LeaseWait.
type WaitOptions struct {
	// Place is the waiter's place in line.
	Place Place
	// Timeout bounds the wait; the wait running out is a *WaitError that
	// matches ErrConflict. Zero waits as long as ctx lasts.
	Timeout time.Duration
	// TicketTTL is how long the waiter's ticket outlives it. Defaults to
	// DefaultTicketTTL; whole seconds, at least 1 s.
	TicketTTL time.Duration
	// OnChange, if set, is called on the waiter's goroutine once the waiter
	// sees itself in line, and each time what it sees changes (the holder
	// or its expiry, the resource's state, its position).
	OnChange func(WaitStatus)
}

// WaitStatus is what a waiter sees of the resource it waits for.
type WaitStatus struct {
	Resource string
	// Holder and Until are the owner of the live lease and its expiry
	// (informative: the broker's TTL decides); Holder is empty when nobody
	// holds the lease.
	Holder string
	Until  time.Time
	// State is the resource's state; empty for an id that is not
	// registered. LastError is its last error.
	State     wire.ResourceState
	LastError string
	// Position is the waiter's place in line (1: next); 0 until the waiter
	// sees its ticket. Waiting counts the line, the waiter included.
	Position, Waiting int
}

// String says why the resource is not taken yet and where the waiter
// stands, e.g. "held by alice until 2026-11-30T14:27:13Z; 2nd of 3 in line".
func (s WaitStatus) String() string {
	var why string
	switch {
	case s.Holder != "":
		why = fmt.Sprintf("held by %s until %s", s.Holder, s.Until.UTC().Format(time.RFC3339))
	case s.State == wire.ResourceDisabled || s.State == wire.ResourceFault:
		why = fmt.Sprintf("%s, waiting to be enabled", s.State)
		if s.LastError != "" {
			why = fmt.Sprintf("%s (last error: %s), waiting to be enabled", s.State, s.LastError)
		}
	default:
		why = "free, being taken"
	}
	if s.Position > 0 {
		why += fmt.Sprintf("; %s of %d in line", ordinal(s.Position), s.Waiting)
	}
	return why
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

// WaitError reports a wait in line that ended before the resource could be
// leased. When the wait ran out of time (its Timeout, or ctx's deadline),
// it matches ErrConflict (and kv.ErrConflict): the resource stayed held.
type WaitError struct {
	Resource string
	// Waited is how long the waiter waited.
	Waited time.Duration
	// Last is what the waiter saw last.
	Last WaitStatus
	// Err is why the wait ended: context.DeadlineExceeded when it ran out
	// of time, else the cause of ctx's end.
	Err error
}

// Error names the resource, the wait and what held it up.
func (e *WaitError) Error() string {
	if !e.timedOut() {
		return fmt.Sprintf("stopped waiting for %s after %v: %v", e.Resource, e.Waited.Round(time.Millisecond), e.Err)
	}
	return fmt.Sprintf("gave up waiting for %s after %v: %v", e.Resource, clock.Round(e.Waited), e.Last)
}

// Unwrap returns why the wait ended.
func (e *WaitError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrConflict) true when the wait ran out of time.
func (e *WaitError) Is(target error) bool {
	return (target == ErrConflict || target == kv.ErrConflict) && e.timedOut()
}

func (e *WaitError) timedOut() bool { return errors.Is(e.Err, context.DeadlineExceeded) }

// LeaseWait leases resource id for owner as Lease does, but if another
// owner holds it, or it is cooling down, DISABLED or FAULT, it waits in
// line for it instead of failing: it takes a ticket at opts.Place and takes
// the lease as soon as the resource is free, leasable and its ticket is
// first. The returned holder's context derives from ctx. If ctx ends, or
// opts.Timeout passes, first, LeaseWait gives its place up and returns a
// *WaitError. A waiter of this process that already sees a line for id
// goes to the back of it without trying to take the lease first.
func (r *Resources) LeaseWait(ctx context.Context, id, owner string, ttl time.Duration, opts WaitOptions) (*ResourceHolder, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if owner == "" {
		return nil, fmt.Errorf("%w: lease resource %s: owner is required", ErrInvalid, id)
	}
	if _, err := TTL(ttl); err != nil {
		return nil, err
	}
	if opts.Timeout < 0 || opts.TicketTTL < 0 {
		return nil, fmt.Errorf("%w: lease resource %s: negative wait timeout or ticket ttl", ErrInvalid, id)
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if opts.Timeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, opts.Timeout)
	}
	defer cancel()
	var first error
	if !r.lines.crowded(id) {
		rh, err := r.Lease(ctx, id, owner, ttl)
		if !waitable(err) {
			return rh, err
		}
		first = err
	}
	w := &waiter{
		r: r, id: id, owner: owner, ttl: ttl, opts: opts, place: opts.Place,
		key:       wire.WaiterKey(id, ulid.Make().String()),
		ticketTTL: kv.TTLSeconds(cmp.Or(opts.TicketTTL, DefaultTicketTTL)),
		since:     r.clock.Now(),
	}
	return w.wait(ctx, wctx, first)
}

// waitable reports whether a failed Lease is one to wait out.
func waitable(err error) bool { return errors.Is(err, ErrConflict) || errors.Is(err, ErrUnavailable) }

// waiter is one LeaseWait in line.
type waiter struct {
	r         *Resources
	id, owner string
	ttl       time.Duration
	opts      WaitOptions
	place     Place
	key       string
	ticketTTL time.Duration
	since     time.Time
}

// attemptGap is the least time between two attempts of a waiter whose
// attempt found the resource taken: its view of the line was behind.
const attemptGap = 20 * time.Millisecond

// wait takes a place in line and waits for its turn; wctx bounds the wait,
// ctx the holder. first is why the lease was not taken at once, if it was
// tried.
func (w *waiter) wait(ctx, wctx context.Context, first error) (*ResourceHolder, error) {
	l := w.r.lines.join(w.id)
	defer w.r.lines.leave(l)
	if err := w.put(wctx); err != nil {
		if wctx.Err() != nil {
			return nil, w.gaveUp(wctx, WaitStatus{Resource: w.id})
		}
		return nil, fmt.Errorf("take a place in line for %s: %w", w.id, err)
	}
	defer w.remove()
	w.emitWaiting(first)

	clk := w.r.clock
	renew := clk.NewTimer(w.ticketTTL / 3)
	defer renew.Stop()
	var retry <-chan time.Time
	backoff := attemptGap
	var seen WaitStatus
	for {
		v, changed := l.view()
		st := v.status(w.key)
		if t, ok := v.arrived(w.key); ok && w.place.Arrived.IsZero() {
			w.place.Arrived = t
		}
		if st.Position > 0 && st != seen {
			seen = st
			if w.opts.OnChange != nil {
				w.opts.OnChange(st)
			}
		}
		if retry == nil && v.turn(w.key) {
			rh, err := w.take(ctx, v)
			switch {
			case err == nil:
				return rh, nil
			case errors.Is(err, ErrInvalid):
				return nil, err
			case wctx.Err() != nil:
				return nil, w.gaveUp(wctx, seen)
			case waitable(err):
				backoff = attemptGap
			default:
				w.r.log.Warn("lease in line failed, retrying", "resource_id", w.id, "owner", w.owner, "err", err)
				backoff = min(2*backoff, w.ticketTTL/3)
			}
			retry = clk.After(backoff)
		}
		select {
		case <-changed:
		case <-retry:
			retry = nil
		case <-renew.C():
			if err := w.put(wctx); err != nil && wctx.Err() == nil {
				w.r.log.Warn("renew place in line", "resource_id", w.id, "owner", w.owner, "err", err)
			}
			renew.Reset(w.ticketTTL / 3)
		case <-wctx.Done():
			return nil, w.gaveUp(wctx, seen)
		}
	}
}

// take leases the resource when the view says it is the waiter's turn,
// from the resource as the view has it (a read fewer; if it is stale, the
// compare-and-swap says so).
func (w *waiter) take(ctx context.Context, v lineView) (*ResourceHolder, error) {
	if v.res == nil {
		return w.r.Lease(ctx, w.id, w.owner, w.ttl)
	}
	return w.r.leaseFrom(ctx, w.id, w.owner, w.ttl, *v.res, true)
}

func (w *waiter) gaveUp(wctx context.Context, last WaitStatus) error {
	return &WaitError{Resource: w.id, Waited: w.r.clock.Now().Sub(w.since), Last: last, Err: context.Cause(wctx)}
}

// put writes the waiter's ticket with its TTL: the first time, or again to
// renew it (or to take the place again if it lapsed: it carries the same
// arrival, so the same place).
func (w *waiter) put(ctx context.Context) error {
	v := wire.Waiter{
		Resource: w.id, Owner: w.owner, TaskID: w.place.TaskID, Priority: w.place.Priority, Seq: w.place.Seq,
		TTL: w.ticketTTL.String(), ExpiresAt: w.r.clock.Now().Add(w.ticketTTL),
	}
	if !w.place.Arrived.IsZero() {
		arrived := w.place.Arrived
		v.Arrived = &arrived
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.r.js.PublishMsg(ctx, kv.Msg(w.r.waiters.Bucket(), w.key, data, w.ticketTTL))
	return err
}

// remove gives the waiter's place up.
func (w *waiter) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if err := w.r.waiters.Purge(ctx, w.key, jetstream.PurgeTTL(markerTTL)); err != nil {
		w.r.log.Warn("give up place in line; it lapses after its ttl", "resource_id", w.id, "owner", w.owner, "ttl", w.ticketTTL, "err", err)
	}
}

// emitWaiting records that the waiter took its place in line; first is why
// it could not lease at once, if it tried.
func (w *waiter) emitWaiting(first error) {
	payload := map[string]any{"owner": w.owner, "priority": w.place.Priority}
	msg := fmt.Sprintf("%s waits in line for %s", w.owner, w.id)
	var ce *ConflictError
	var ue *UnavailableError
	switch {
	case errors.As(first, &ce):
		payload["holder"], payload["expires_at"] = ce.Holder, ce.ExpiresAt
		msg += fmt.Sprintf(", held by %s until %s", ce.Holder, ce.ExpiresAt.UTC().Format(time.RFC3339))
	case errors.As(first, &ue):
		payload["state"] = ue.State
		msg += fmt.Sprintf(", %s", ue.State)
	}
	w.r.ev.emit(wire.Event{
		Type: wire.EventResourceWaiting, ResourceID: w.id, TaskID: w.place.TaskID, JobID: w.place.Job,
		Message: msg, Payload: audit.Payload(payload),
	})
}

// lines follows the line of each resource the process's waiters wait for.
type lines struct {
	r   *Resources
	mu  sync.Mutex
	all map[string]*line
}

// join returns the line of resource id, following it if nobody in this
// process did; leave it when done.
func (ls *lines) join(id string) *line {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.all[id]
	if l == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l = &line{r: ls.r, id: id, cancel: cancel, changed: make(chan struct{}), tickets: map[string]ticket{}}
		ls.all[id] = l
		go l.run(ctx)
	}
	l.refs++
	return l
}

// leave stops following l once its last waiter of this process left. It
// does not wait for the watches to stop: a waiter whose turn came starts
// its work without that.
func (ls *lines) leave(l *line) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(ls.all, l.id)
		l.cancel()
	}
}

// crowded reports whether this process sees anyone in line for id.
func (ls *lines) crowded(id string) bool {
	ls.mu.Lock()
	l := ls.all[id]
	ls.mu.Unlock()
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tickets) > 0
}

// line is this process's view of one resource: its lease, its state and
// its line, kept by three KV watches.
type line struct {
	r      *Resources
	id     string
	refs   int // guarded by lines.mu
	cancel context.CancelFunc

	mu sync.Mutex
	// synced counts the watches that delivered their initial values.
	synced  int
	lease   *wire.Lease
	res     *Resource
	tickets map[string]ticket
	// changed is closed, and replaced, on every change.
	changed chan struct{}
}

// ticket is one place in line as read.
type ticket struct {
	key string
	w   wire.Waiter
	// arrived is w.Arrived, or the time of the write that left it out.
	arrived time.Time
}

// lineOrder orders tickets: higher priority first, then earlier arrival,
// then lower sequence, then key.
func lineOrder(a, b ticket) int {
	return cmp.Or(
		cmp.Compare(b.w.Priority, a.w.Priority),
		a.arrived.Compare(b.arrived),
		cmp.Compare(a.w.Seq, b.w.Seq),
		strings.Compare(a.key, b.key),
	)
}

// decodeTicket reads one entry of gantry_waiters.
func decodeTicket(e jetstream.KeyValueEntry) (ticket, error) {
	var w wire.Waiter
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		return ticket{}, fmt.Errorf("decode place in line %s: %w", e.Key(), err)
	}
	t := ticket{key: e.Key(), w: w, arrived: e.Created()}
	if w.Arrived != nil {
		t.arrived = *w.Arrived
	}
	return t, nil
}

// followRetry is how long a line waits before following its keys again
// after a watch ended under it.
const followRetry = time.Second

// run keeps the line's view until cancelled.
func (l *line) run(ctx context.Context) {
	for {
		err := l.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		l.r.log.Warn("following the line of a resource, again in a moment", "resource_id", l.id, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-l.r.clock.After(followRetry):
		}
	}
}

var errWatchClosed = errors.New("watcher closed")

// follow watches the resource's lease, state and line until ctx ends or a
// watch does.
func (l *line) follow(ctx context.Context) error {
	lw, err := l.r.leases.kv.Watch(ctx, l.id)
	if err != nil {
		return fmt.Errorf("watch lease %s: %w", l.id, err)
	}
	defer func() { _ = lw.Stop() }()
	rw, err := l.r.kv.Watch(ctx, l.id)
	if err != nil {
		return fmt.Errorf("watch resource %s: %w", l.id, err)
	}
	defer func() { _ = rw.Stop() }()
	tw, err := l.r.waiters.Watch(ctx, l.id+".*")
	if err != nil {
		return fmt.Errorf("watch line of %s: %w", l.id, err)
	}
	defer func() { _ = tw.Stop() }()
	l.update(func() {
		l.synced, l.lease, l.res = 0, nil, nil
		clear(l.tickets)
	})
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		var apply func(jetstream.KeyValueEntry)
		select {
		case <-ctx.Done():
			return nil
		case e, ok = <-lw.Updates():
			apply = l.applyLease
		case e, ok = <-rw.Updates():
			apply = l.applyResource
		case e, ok = <-tw.Updates():
			apply = l.applyTicket
		}
		if !ok {
			return errWatchClosed
		}
		l.update(func() {
			if e == nil {
				l.synced++
				return
			}
			apply(e)
		})
	}
}

// update changes the view under its lock and tells the waiters.
func (l *line) update(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn()
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *line) applyLease(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		l.lease = nil
		// The next acquire compare-and-swaps on this marker at once.
		l.r.leases.setHint(l.id, e.Revision())
		return
	}
	lease, _, err := decodeLease(e)
	if err != nil {
		l.r.log.Warn("undecodable lease; waiting for it to lapse", "resource_id", l.id, "err", err)
		lease = wire.Lease{Resource: l.id, Owner: "(undecodable lease)", Revision: e.Revision()}
	}
	l.lease = &lease
}

func (l *line) applyResource(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		l.res = nil
		return
	}
	res, err := decodeResource(e)
	if err != nil {
		// Lease reads it again and reports it; meanwhile, not known.
		l.r.log.Warn("undecodable resource", "resource_id", l.id, "err", err)
		l.res = nil
		return
	}
	l.res = &res
}

func (l *line) applyTicket(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		delete(l.tickets, e.Key())
		return
	}
	t, err := decodeTicket(e)
	if err != nil {
		l.r.log.Warn("skipping undecodable place in line", "resource_id", l.id, "key", e.Key(), "err", err)
		delete(l.tickets, e.Key())
		return
	}
	l.tickets[e.Key()] = t
}

// lineView is a snapshot of a line.
type lineView struct {
	id      string
	synced  bool
	lease   *wire.Lease
	res     *Resource
	tickets []ticket
}

// view returns the line as it is now and a channel closed at its next
// change.
func (l *line) view() (lineView, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := lineView{id: l.id, synced: l.synced == 3, lease: l.lease, res: l.res}
	v.tickets = make([]ticket, 0, len(l.tickets))
	for _, t := range l.tickets {
		v.tickets = append(v.tickets, t)
	}
	slices.SortFunc(v.tickets, lineOrder)
	return v, l.changed
}

// status is what the waiter holding ticket key sees.
func (v lineView) status(key string) WaitStatus {
	st := WaitStatus{Resource: v.id, Waiting: len(v.tickets)}
	if v.lease != nil {
		st.Holder, st.Until = v.lease.Owner, v.lease.ExpiresAt
	}
	if v.res != nil {
		st.State, st.LastError = v.res.State, v.res.LastError
	}
	for i, t := range v.tickets {
		if t.key == key {
			st.Position = i + 1
		}
	}
	return st
}

// arrived returns the arrival of ticket key, if the view has it.
func (v lineView) arrived(key string) (time.Time, bool) {
	for _, t := range v.tickets {
		if t.key == key {
			return t.arrived, true
		}
	}
	return time.Time{}, false
}

// turn reports whether the waiter with ticket key may take the lease now:
// its ticket is first, nobody holds the lease and the resource is neither
// DISABLED nor FAULT. A lease of the waiter's own owner counts as held: it
// is another holder of that name (two deliveries of one task, two
// processes given one --owner), which Acquire would renew rather than
// refuse.
func (v lineView) turn(key string) bool {
	if !v.synced || len(v.tickets) == 0 || v.tickets[0].key != key {
		return false
	}
	if v.res != nil && (v.res.State == wire.ResourceDisabled || v.res.State == wire.ResourceFault) {
		return false
	}
	return v.lease == nil
}

// waiting reads the lines of the resources whose tickets match filter
// (every line when empty), next first, by resource.
func (r *Resources) waiting(ctx context.Context, filter string) (map[string][]wire.Waiter, error) {
	entries, err := kv.Entries(ctx, r.waiters, filter)
	if err != nil {
		return nil, fmt.Errorf("read lines: %w", err)
	}
	byRes := map[string][]ticket{}
	for _, e := range entries {
		res, ok := wire.WaiterResource(e.Key())
		if !ok {
			continue
		}
		t, err := decodeTicket(e)
		if err != nil {
			r.log.Warn("skipping undecodable place in line", "key", e.Key(), "err", err)
			continue
		}
		byRes[res] = append(byRes[res], t)
	}
	out := make(map[string][]wire.Waiter, len(byRes))
	for res, ts := range byRes {
		slices.SortFunc(ts, lineOrder)
		line := make([]wire.Waiter, 0, len(ts))
		for _, t := range ts {
			w := t.w
			arrived := t.arrived
			w.Arrived = &arrived
			line = append(line, w)
		}
		out[res] = line
	}
	return out, nil
}
