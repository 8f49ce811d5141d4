package lease_test

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/clock"
	"github.com/gantry-dev/gantry/lease"
)

// The lease model test (docs/RELIABILITY.md, "Lease model test"): rapid
// draws rounds in which several clients, each on its own connection, clock
// and lease store, acquire, renew, release, stop renewing and pause past
// the TTL on one or two resources of a real broker, all at once. Every
// client logs when it believed it held what, and under which revisions;
// the invariants are checked on that log, not on the broker's state.

const (
	// modelTTL is the shortest TTL the broker applies (whole seconds).
	modelTTL = time.Second
	// modelRenew is a Holder's renew period for modelTTL.
	modelRenew = modelTTL / 3
	// modelClients is how many clients share the broker.
	modelClients = 5
	// modelDefaultOps is the short form's operation count; set
	// GANTRY_MODEL_OPS (e.g. 10000) for the long form.
	modelDefaultOps = 60
)

// TestLeaseModel checks, over random concurrent rounds, that no two
// clients ever believe they hold one resource at once (by revision and by
// time), that a holder paused past its TTL learns the loss within TTL +
// one renew period of resuming and that its stale window is fenced off by
// the newer holder's revision.
func TestLeaseModel(t *testing.T) {
	target := modelDefaultOps
	if s := os.Getenv("GANTRY_MODEL_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("GANTRY_MODEL_OPS = %q, want a positive count", s)
		}
		target = n
	}
	// One check per rapid.Check call unless -rapid.checks says otherwise:
	// the loop below then runs rounds until target operations are done.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if !explicit {
		f := flag.Lookup("rapid.checks")
		old := f.Value.String()
		if err := f.Value.Set("1"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Value.Set(old) })
	}

	env := brokertest.Start(t)
	clients := make([]*modelClient, modelClients)
	for i := range clients {
		clients[i] = newModelClient(t, env, i)
	}
	st := &modelStats{}
	round := 0
	for st.ops.Load() < int64(target) && !t.Failed() {
		rapid.Check(t, func(rt *rapid.T) {
			round++
			runModelRound(rt, clients, round, st)
		})
	}
	t.Logf("lease model: %d operations in %d rounds, %d holdings, double holders %d, %d pauses past the TTL, %d stale windows fenced, "+
		"time to learn loss after resuming max %v (bound TTL + renew period = %v)",
		st.ops.Load(), round, st.holdings.Load(), st.doubles.Load(), st.pauses.Load(), st.fenced.Load(),
		time.Duration(st.maxLearn.Load()), modelTTL+modelRenew)
}

type modelStats struct {
	ops, holdings, doubles, pauses, fenced, maxLearn atomic.Int64
}

// modelClient is one process of the model: its own connection, lease
// store and clock. The clock follows real time except while the client is
// paused (as a stopped process's timers do), and jumps to real time when
// it resumes.
type modelClient struct {
	id     int
	leases *lease.Leases
	clk    *clock.Fake
	paused atomic.Bool
}

func newModelClient(t *testing.T, env *brokertest.Env, id int) *modelClient {
	_, js := brokertest.Connect(t, env.URL)
	c := &modelClient{id: id, clk: clock.NewFake(time.Now())}
	l, err := lease.NewLeases(js, lease.LeasesConfig{Audit: audit.NewEmitter(js, "model", nil), Logger: env.Log, Clock: c.clk})
	if err != nil {
		t.Fatal(err)
	}
	c.leases = l
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				if !c.paused.Load() {
					c.clk.Set(now)
				}
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return c
}

// Operation kinds of a client's program.
const (
	opHold    = iota // Hold, keep it a while, then end it
	opAcquire        // Acquire, renew by hand, then release or let it lapse
)

// How a Holder ends.
const (
	endRelease = iota // Release
	endAbandon        // cancel Hold's context: renewals stop, it lapses
	endPause          // the client pauses past the TTL, then resumes
)

type modelOp struct {
	kind, resource, end int
	keep                time.Duration   // how long a Holder holds before its end
	pause               time.Duration   // endPause: how long
	gaps                []time.Duration // opAcquire: the wait before each renewal
	release             bool            // opAcquire: release at the end
}

// span is a time a client believed it held a resource.
type span struct{ from, to time.Time }

func (s span) overlaps(o span) bool { return s.from.Before(o.to) && o.from.Before(s.to) }

// holding is one client's unbroken possession of one resource: every
// revision it held it under and when it believed it held it. stale is the
// window after a pause in which it still believed so, not yet knowing it
// lost the lease.
type holding struct {
	client   int
	resource string
	revs     []uint64
	spans    []span
	stale    *span
}

func (h *holding) first() uint64 { return h.revs[0] }
func (h *holding) last() uint64  { return h.revs[len(h.revs)-1] }

// modelLog collects the holdings of a round.
type modelLog struct {
	mu       sync.Mutex
	holdings []*holding
	errs     []error
}

func (l *modelLog) add(h *holding) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holdings = append(l.holdings, h)
}

func (l *modelLog) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func drawProgram(rt *rapid.T, label string, resources int) []modelOp {
	n := rapid.IntRange(1, 4).Draw(rt, label+"_ops")
	prog := make([]modelOp, n)
	for i := range prog {
		op := modelOp{
			kind:     rapid.IntRange(opHold, opAcquire).Draw(rt, label+"_kind"),
			resource: rapid.IntRange(0, resources-1).Draw(rt, label+"_res"),
		}
		if op.kind == opHold {
			op.keep = time.Duration(rapid.IntRange(0, 800).Draw(rt, label+"_keep_ms")) * time.Millisecond
			// Pauses take more than a TTL each: one in five ends.
			op.end = rapid.SampledFrom([]int{endRelease, endRelease, endAbandon, endAbandon, endPause}).Draw(rt, label+"_end")
			if op.end == endPause {
				op.pause = modelTTL + time.Duration(rapid.IntRange(200, 800).Draw(rt, label+"_pause_ms"))*time.Millisecond
			}
		} else {
			for range rapid.IntRange(0, 3).Draw(rt, label+"_renewals") {
				gap := time.Duration(rapid.IntRange(0, 500).Draw(rt, label+"_gap_ms")) * time.Millisecond
				if rapid.IntRange(0, 9).Draw(rt, label+"_late") == 0 {
					gap += modelTTL // stopped renewing past the TTL
				}
				op.gaps = append(op.gaps, gap)
			}
			op.release = rapid.Bool().Draw(rt, label+"_release")
		}
		prog[i] = op
	}
	return prog
}

func runModelRound(rt *rapid.T, clients []*modelClient, round int, st *modelStats) {
	resources := rapid.IntRange(1, 2).Draw(rt, "resources")
	n := rapid.IntRange(2, len(clients)).Draw(rt, "clients")
	progs := make([][]modelOp, n)
	for i := range progs {
		progs[i] = drawProgram(rt, fmt.Sprintf("c%d", i), resources)
	}
	log := &modelLog{}
	var wg sync.WaitGroup
	for i, prog := range progs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clients[i].run(round, prog, log, st)
		}()
	}
	wg.Wait()
	for _, err := range log.errs {
		rt.Error(err)
	}
	for r := range resources {
		checkHoldings(rt, resourceName(round, r), log.holdings, st)
	}
	st.holdings.Add(int64(len(log.holdings)))
}

func resourceName(round, r int) string { return fmt.Sprintf("model-%d-%d", round, r) }

// checkHoldings checks the invariants on one resource's holdings.
func checkHoldings(rt *rapid.T, resource string, all []*holding, st *modelStats) {
	var hs []*holding
	for _, h := range all {
		if h.resource == resource {
			hs = append(hs, h)
		}
	}
	// By revision: one holding's revisions all come before the next one's.
	slices.SortFunc(hs, func(a, b *holding) int { return cmp.Compare(a.first(), b.first()) })
	for i, h := range hs {
		if !slices.IsSorted(h.revs) {
			rt.Errorf("%s: client %d's revisions %v are not increasing", resource, h.client, h.revs)
		}
		if i > 0 && hs[i-1].last() >= h.first() {
			st.doubles.Add(1)
			rt.Errorf("%s: double holder by revision: client %d held revisions %v, client %d took it at %d",
				resource, hs[i-1].client, hs[i-1].revs, h.client, h.first())
		}
	}
	// By time: believed spans never overlap; a stale window after a pause
	// may, but only under an older revision than the other holder's, so
	// that the resource's fencing rejects what the stale holder writes.
	for i, a := range hs {
		for _, b := range hs[i+1:] {
			for _, sa := range a.spans {
				for _, sb := range b.spans {
					if sa.overlaps(sb) {
						st.doubles.Add(1)
						rt.Errorf("%s: double holder by time: client %d %v–%v and client %d %v–%v", resource,
							a.client, sa.from.Format(time.StampMicro), sa.to.Format(time.StampMicro),
							b.client, sb.from.Format(time.StampMicro), sb.to.Format(time.StampMicro))
					}
				}
			}
			checkStale(rt, resource, a, b, st)
			checkStale(rt, resource, b, a, st)
		}
	}
}

// checkStale checks that a's stale window, if it overlaps a span of b,
// is fenced: a's revisions all precede b's.
func checkStale(rt *rapid.T, resource string, a, b *holding, st *modelStats) {
	if a.stale == nil {
		return
	}
	for _, sb := range b.spans {
		if !a.stale.overlaps(sb) {
			continue
		}
		if a.last() >= b.first() {
			st.doubles.Add(1)
			rt.Errorf("%s: client %d's stale window under revision %d overlaps client %d's holding from revision %d: not fenced",
				resource, a.client, a.last(), b.client, b.first())
			return
		}
		st.fenced.Add(1)
		return
	}
}

func (c *modelClient) run(round int, prog []modelOp, log *modelLog, st *modelStats) {
	for i, op := range prog {
		owner := fmt.Sprintf("c%d-%d-%d", c.id, round, i)
		res := resourceName(round, op.resource)
		var err error
		if op.kind == opHold {
			err = c.hold(res, owner, op, log, st)
		} else {
			err = c.acquire(res, owner, op, log, st)
		}
		if err != nil {
			log.fail(fmt.Errorf("client %d %s: %w", c.id, res, err))
			return
		}
	}
}

// hold runs an opHold: the client believes it holds from Hold's return
// until it ends the holding or the Holder's context is cancelled.
func (c *modelClient) hold(res, owner string, op modelOp, log *modelLog, st *modelStats) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st.ops.Add(1)
	h, err := c.leases.Hold(ctx, res, owner, modelTTL)
	if errors.Is(err, lease.ErrConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	start := time.Now()
	var cancelledAt atomic.Pointer[time.Time]
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-h.Context().Done()
		now := time.Now()
		cancelledAt.Store(&now)
	}()
	hd := &holding{client: c.id, resource: res, revs: []uint64{h.Lease().Revision}}
	defer log.add(hd)
	// end closes the believed span at the earlier of at and the Holder's
	// cancellation, and notes the last revision renewed.
	end := func(at time.Time) {
		if p := cancelledAt.Load(); p != nil && p.Before(at) {
			at = *p
		}
		hd.spans = append(hd.spans, span{start, at})
		if rev := h.Lease().Revision; rev != hd.last() {
			hd.revs = append(hd.revs, rev)
		}
	}
	time.Sleep(op.keep) // the work under the lease
	switch op.end {
	case endRelease:
		end(time.Now())
		st.ops.Add(1)
		if err := h.Release(context.Background()); err != nil && !errors.Is(err, lease.ErrLost) {
			return fmt.Errorf("release: %w", err)
		}
	case endAbandon:
		end(time.Now())
		st.ops.Add(1)
		cancel()
	case endPause:
		st.ops.Add(1)
		st.pauses.Add(1)
		c.paused.Store(true)
		pausedAt := time.Now()
		end(pausedAt)
		time.Sleep(op.pause)
		before := h.Lease().Revision
		resumed := time.Now()
		c.paused.Store(false)
		// The Holder's renewal timer is overdue: on resuming it renews,
		// and either finds the lease lost (cancelling its context) or,
		// if the broker had not expired it yet and nobody took it,
		// renews it under a new revision.
		err := check.Until(modelTTL+modelRenew+5*time.Second, 2*time.Millisecond, func() error {
			if h.Context().Err() != nil || h.Lease().Revision != before {
				return nil
			}
			return errors.New("the holder neither renewed nor learned of the loss")
		})
		if err != nil {
			return fmt.Errorf("after a pause of %v: %w", op.pause, err)
		}
		if h.Context().Err() != nil {
			<-watched
			learned := *cancelledAt.Load()
			hd.stale = &span{resumed, learned}
			took := learned.Sub(resumed)
			for {
				old := st.maxLearn.Load()
				if int64(took) <= old || st.maxLearn.CompareAndSwap(old, int64(took)) {
					break
				}
			}
			if took > modelTTL+modelRenew {
				return fmt.Errorf("learned of the loss %v after resuming, want within %v", took, modelTTL+modelRenew)
			}
		} else {
			start = resumed
			end(time.Now())
		}
		if err := h.Release(context.Background()); err != nil && !errors.Is(err, lease.ErrLost) {
			return fmt.Errorf("release after pause: %w", err)
		}
	}
	cancel()
	<-watched
	return nil
}

// acquire runs an opAcquire: the client believes it holds from each
// successful acquire or renewal until the TTL after it sent it (the broker
// stored it later, so its expiry is later), or until it releases.
func (c *modelClient) acquire(res, owner string, op modelOp, log *modelLog, st *modelStats) error {
	ctx := context.Background()
	st.ops.Add(1)
	sent := time.Now()
	l, err := c.leases.Acquire(ctx, res, owner, modelTTL)
	if errors.Is(err, lease.ErrConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	hd := &holding{client: c.id, resource: res, revs: []uint64{l.Revision}}
	defer log.add(hd)
	cur := span{time.Now(), sent.Add(modelTTL)}
	for _, gap := range op.gaps {
		time.Sleep(gap)
		st.ops.Add(1)
		sent := time.Now()
		renewed, err := c.leases.Renew(ctx, l, modelTTL)
		if errors.Is(err, lease.ErrLost) {
			hd.spans = append(hd.spans, cur)
			return nil
		}
		if err != nil {
			return fmt.Errorf("renew: %w", err)
		}
		if sent.Before(cur.to) {
			cur.to = sent.Add(modelTTL)
		} else {
			// It had lapsed by the client's clock, yet the broker still
			// had it: a new span from the renewal's answer.
			hd.spans = append(hd.spans, cur)
			cur = span{time.Now(), sent.Add(modelTTL)}
		}
		l = renewed
		hd.revs = append(hd.revs, l.Revision)
	}
	if op.release {
		st.ops.Add(1)
		if at := time.Now(); at.Before(cur.to) {
			cur.to = at
		}
		if err := c.leases.Release(ctx, l); err != nil && !errors.Is(err, lease.ErrLost) {
			return fmt.Errorf("release: %w", err)
		}
	}
	hd.spans = append(hd.spans, cur)
	return nil
}
