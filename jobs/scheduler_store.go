package jobs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// Keys of wire.BucketScheduler.
const (
	schedLeaderKey   = "leader"
	schedTermKey     = "term"
	schedStatePrefix = "state."
	schedRunPrefix   = "run."
	schedCoolPrefix  = "cooldown."
)

// ErrLeaderHeld is returned by SchedulerStore.Campaign while another
// scheduler's leader key is live.
var ErrLeaderHeld = errors.New("scheduler leadership held")

// ErrNoLeader is returned by SchedulerStore.Leader when no scheduler leads.
var ErrNoLeader = errors.New("no scheduler leads")

// ErrRunNotFound is returned for a run absent from the history. It matches
// kv.ErrNotFound.
var ErrRunNotFound = kv.Sentinel("job run not found", kv.ErrNotFound)

// SchedulerStore is the typed store of scheduler state in
// wire.BucketScheduler: the leader lease ("leader", per-key TTL, renewed by
// compare-and-swap), the fencing term counter ("term"), each job's
// wire.JobState ("state.<job>"), the run history ("run.<job>.<planned unix
// ns>", with a per-key TTL) and resource cooldowns ("cooldown.<resource>").
//
// A bad value is never a wedge: a leader key that is not a leader or was
// written without the broker's TTL (it would never expire) is deleted by
// the next campaign, a term that is not a number is replaced by one above
// every term issued, and a bad job state, run or cooldown is skipped. Each
// is reported to Quarantine.
type SchedulerStore struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream jetstream.Stream // KV_<bucket>

	// Quarantine, when set, records the bad values the store met.
	Quarantine *kv.Quarantine
}

// MaxLeaderTTL is the longest TTL a leader key may claim: one written with a
// longer one (or none) is taken for forged and deleted.
const MaxLeaderTTL = time.Hour

// NewSchedulerStore opens the scheduler bucket, which the broker provisions.
func NewSchedulerStore(ctx context.Context, js jetstream.JetStream) (*SchedulerStore, error) {
	b, err := kv.Open(ctx, js, wire.BucketScheduler)
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, "KV_"+wire.BucketScheduler)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", wire.BucketScheduler, err)
	}
	return &SchedulerStore{js: js, kv: b, stream: stream}, nil
}

// KeyValue returns the underlying bucket, for watching.
func (s *SchedulerStore) KeyValue() jetstream.KeyValue { return s.kv }

// LeaderKey is the key of the leader lease, for watchers.
func (s *SchedulerStore) LeaderKey() string { return schedLeaderKey }

// Campaign tries to become the leader: it takes the next fencing term and
// creates the leader key with ttl. It fails with ErrLeaderHeld (wrapped,
// with the holder) while another leader's key is live. Terms only grow; a
// failed campaign may leave a gap. A bad leader key is deleted first.
func (s *SchedulerStore) Campaign(ctx context.Context, id, host string, now time.Time, ttl time.Duration) (wire.SchedulerLeader, uint64, error) {
	if err := s.leaderFree(ctx); err != nil {
		return wire.SchedulerLeader{}, 0, err
	}
	term, err := s.nextTerm(ctx)
	if err != nil {
		return wire.SchedulerLeader{}, 0, err
	}
	l := wire.SchedulerLeader{ID: id, Host: host, Term: term, Since: now}
	data, err := json.Marshal(l)
	if err != nil {
		return wire.SchedulerLeader{}, 0, fmt.Errorf("encode leader: %w", err)
	}
	rev, err := s.kv.Create(ctx, schedLeaderKey, data, jetstream.KeyTTL(ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return wire.SchedulerLeader{}, 0, fmt.Errorf("%w: %w", ErrLeaderHeld, err)
	}
	if err != nil {
		return wire.SchedulerLeader{}, 0, fmt.Errorf("create leader key: %w", err)
	}
	return l, rev, nil
}

// leaderFree returns nil when no valid leader key is live, and
// ErrLeaderHeld (wrapped, with the holder) otherwise. It reads the key's
// last message, headers and all: a value that is not a leader, or that
// carries no TTL (or one over MaxLeaderTTL) and so would hold the key
// forever, is deleted at its revision and quarantined.
func (s *SchedulerStore) leaderFree(ctx context.Context) error {
	m, err := s.stream.GetLastMsgForSubject(ctx, kv.Subject(wire.BucketScheduler, schedLeaderKey))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read leader key: %w", err)
	}
	if kv.Marker(m.Header) {
		return nil
	}
	var l wire.SchedulerLeader
	bad := json.Unmarshal(m.Data, &l)
	if bad == nil && l.ID == "" {
		bad = errors.New("no scheduler id")
	}
	if bad == nil {
		bad = kv.CheckTTL(m.Header, MaxLeaderTTL)
	}
	if bad == nil {
		return fmt.Errorf("%w by %s (term %d)", ErrLeaderHeld, l.ID, l.Term)
	}
	err = s.kv.Purge(ctx, schedLeaderKey, jetstream.LastRevision(m.Sequence))
	if err != nil && !kv.Conflict(err) {
		return fmt.Errorf("delete bad leader key: %w", err)
	}
	s.Quarantine.Report(kv.BadValue(wire.BucketScheduler, schedLeaderKey, m.Sequence, bad), "deleted")
	return nil
}

// nextTerm increments the term counter by compare-and-swap. A term that is
// not a number is replaced by one above every term issued: each was
// written at a revision at least its value, all below the bad value's.
func (s *SchedulerStore) nextTerm(ctx context.Context) (uint64, error) {
	for {
		var cur, rev uint64
		e, err := s.kv.Get(ctx, schedTermKey)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return 0, fmt.Errorf("get term: %w", err)
		default:
			rev = e.Revision()
			if cur, err = strconv.ParseUint(string(e.Value()), 10, 64); err != nil {
				s.Quarantine.Report(kv.BadValue(wire.BucketScheduler, schedTermKey, rev, fmt.Errorf("term %q is not a number", e.Value())),
					fmt.Sprintf("replaced by term %d", rev+1))
				cur = rev
			}
		}
		next := []byte(strconv.FormatUint(cur+1, 10))
		if rev == 0 {
			_, err = s.kv.Create(ctx, schedTermKey, next)
		} else {
			_, err = s.kv.Update(ctx, schedTermKey, next, rev)
		}
		if kv.Conflict(err) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("advance term: %w", err)
		}
		return cur + 1, nil
	}
}

// Renew extends the leader key held at rev by ttl, by compare-and-swap, and
// returns its new revision. It fails if anyone else wrote the key since, or
// it expired. (KV Update would drop the TTL, hence the publish.)
func (s *SchedulerStore) Renew(ctx context.Context, l wire.SchedulerLeader, rev uint64, ttl time.Duration) (uint64, error) {
	data, err := json.Marshal(l)
	if err != nil {
		return 0, fmt.Errorf("encode leader: %w", err)
	}
	ack, err := s.js.Publish(ctx, kv.Subject(wire.BucketScheduler, schedLeaderKey), data,
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	if err != nil {
		return 0, fmt.Errorf("renew leader key: %w", err)
	}
	return ack.Sequence, nil
}

// Resign deletes the leader key if it is still at rev, so another scheduler
// can lead at once.
func (s *SchedulerStore) Resign(ctx context.Context, rev uint64) error {
	if err := s.kv.Purge(ctx, schedLeaderKey, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("resign leadership: %w", err)
	}
	return nil
}

// Leader returns the current leader and its key's revision, or ErrNoLeader.
func (s *SchedulerStore) Leader(ctx context.Context) (wire.SchedulerLeader, uint64, error) {
	e, err := s.kv.Get(ctx, schedLeaderKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.SchedulerLeader{}, 0, ErrNoLeader
	}
	if err != nil {
		return wire.SchedulerLeader{}, 0, fmt.Errorf("get leader: %w", err)
	}
	var l wire.SchedulerLeader
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return wire.SchedulerLeader{}, 0, kv.BadValue(wire.BucketScheduler, schedLeaderKey, e.Revision(), err)
	}
	return l, e.Revision(), nil
}

// States returns every job's persisted state, by job name.
func (s *SchedulerStore) States(ctx context.Context) (map[string]wire.JobState, error) {
	out := map[string]wire.JobState{}
	err := s.each(ctx, schedStatePrefix+">", func(_ string, v []byte) error {
		var st wire.JobState
		if err := json.Unmarshal(v, &st); err != nil {
			return fmt.Errorf("decode job state: %w", err)
		}
		out[st.Job] = st
		return nil
	})
	return out, err
}

// State returns one job's persisted state; a job never fired has a zero
// state.
func (s *SchedulerStore) State(ctx context.Context, job string) (wire.JobState, error) {
	e, err := s.kv.Get(ctx, schedStatePrefix+job)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.JobState{Job: job}, nil
	}
	if err != nil {
		return wire.JobState{}, fmt.Errorf("get job state %s: %w", job, err)
	}
	var st wire.JobState
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		// As States does: a bad state is skipped.
		s.Quarantine.Report(kv.BadValue(wire.BucketScheduler, e.Key(), e.Revision(), err), "skipped")
		return wire.JobState{Job: job}, nil
	}
	return st, nil
}

// StateMsg returns the put of a job's state as a message on the bucket's
// subject, for a caller that publishes it without waiting.
func (s *SchedulerStore) StateMsg(st wire.JobState) (*nats.Msg, error) {
	return putMsg(schedStatePrefix+st.Job, st, 0)
}

// DeleteState forgets a deleted job's state.
func (s *SchedulerStore) DeleteState(ctx context.Context, job string) error {
	if err := s.kv.Purge(ctx, schedStatePrefix+job); err != nil {
		return fmt.Errorf("delete job state %s: %w", job, err)
	}
	return nil
}

// RunMsg returns the put of a run in the history, kept for ttl (whole
// seconds, at least 1 s; 0 keeps it until the bucket's limits), as a
// message for a caller that publishes it without waiting.
func (s *SchedulerStore) RunMsg(r wire.JobRun, ttl time.Duration) (*nats.Msg, error) {
	return putMsg(runKey(r.Job, r.Planned), r, ttl)
}

// Run returns the run of job planned at planned.
func (s *SchedulerStore) Run(ctx context.Context, job string, planned time.Time) (wire.JobRun, error) {
	e, err := s.kv.Get(ctx, runKey(job, planned))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.JobRun{}, fmt.Errorf("job %s at %s: %w", job, planned.Format(time.RFC3339Nano), ErrRunNotFound)
	}
	if err != nil {
		return wire.JobRun{}, fmt.Errorf("get run: %w", err)
	}
	var r wire.JobRun
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return wire.JobRun{}, fmt.Errorf("decode run: %w", err)
	}
	return r, nil
}

// Runs returns the latest limit runs of job, oldest first; limit <= 0
// returns them all.
func (s *SchedulerStore) Runs(ctx context.Context, job string, limit int) ([]wire.JobRun, error) {
	var runs []wire.JobRun
	err := s.each(ctx, schedRunPrefix+job+".*", func(_ string, v []byte) error {
		var r wire.JobRun
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("decode run: %w", err)
		}
		runs = append(runs, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Planned.Before(runs[j].Planned) })
	if limit > 0 && len(runs) > limit {
		runs = runs[len(runs)-limit:]
	}
	return runs, nil
}

// Cooldowns returns the end of every resource's cooldown, by resource.
func (s *SchedulerStore) Cooldowns(ctx context.Context) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	err := s.each(ctx, schedCoolPrefix+">", func(_ string, v []byte) error {
		var c cooldown
		if err := json.Unmarshal(v, &c); err != nil {
			return fmt.Errorf("decode cooldown: %w", err)
		}
		out[c.Resource] = c.Until
		return nil
	})
	return out, err
}

// CooldownMsg returns the record that jobs on resource wait until until,
// as a message for a caller that publishes it without waiting.
func (s *SchedulerStore) CooldownMsg(resource string, until time.Time) (*nats.Msg, error) {
	key := schedCoolPrefix + base64.RawURLEncoding.EncodeToString([]byte(resource))
	return putMsg(key, cooldown{Resource: resource, Until: until}, 0)
}

type cooldown struct {
	Resource string    `json:"resource"`
	Until    time.Time `json:"until"`
}

func runKey(job string, planned time.Time) string {
	return schedRunPrefix + job + "." + strconv.FormatInt(planned.UnixNano(), 10)
}

// putMsg returns the put of v under key as a message on the bucket's
// subject, with a TTL when ttl > 0.
func putMsg(key string, v any, ttl time.Duration) (*nats.Msg, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", key, err)
	}
	return kv.Msg(wire.BucketScheduler, key, data, ttl), nil
}

// each calls fn with the live value of every key matching filter. A value
// fn cannot decode is skipped and quarantined.
func (s *SchedulerStore) each(ctx context.Context, filter string, fn func(key string, v []byte) error) error {
	entries, err := kv.Entries(ctx, s.kv, filter)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := fn(e.Key(), e.Value()); err != nil {
			s.Quarantine.Report(kv.BadValue(wire.BucketScheduler, e.Key(), e.Revision(), err), "skipped")
		}
	}
	return nil
}
