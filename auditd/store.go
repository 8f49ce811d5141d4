package auditd

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/disk"
	"github.com/gantry-dev/gantry/kv"
)

// Query limits.
const (
	// DefaultLimit is the page size of a query that sets none.
	DefaultLimit = 100
	// MaxLimit is the largest page a query may ask for.
	MaxLimit = 10000
)

var (
	// ErrBadQuery marks a query that cannot be answered as asked: a bad
	// cursor, a limit out of range, an empty time range. It matches
	// kv.ErrInvalid (the service answers 400).
	ErrBadQuery = kv.Sentinel("bad audit query", kv.ErrInvalid)
	// ErrInvalidEvent marks an event that cannot be stored: no id, no type,
	// no time, or a 0x00 byte in an indexed field.
	ErrInvalidEvent = errors.New("invalid audit event")
	// ErrUnavailable is returned while the store is failed, after a write
	// error and until Recover reopens it. It matches kv.ErrUnavailable (the
	// service answers 503).
	ErrUnavailable = kv.Sentinel("audit store unavailable", kv.ErrUnavailable)
)

// StoreOptions tunes OpenStore.
type StoreOptions struct {
	// Logger receives Pebble's messages (info as debug). Defaults to
	// discarding them.
	Logger *slog.Logger
	// FS is the file system Pebble writes through. Defaults to the
	// operating system's; tests inject errors through it.
	FS vfs.FS
	// ScanBudget caps the keys one query page reads. A page that reaches it
	// holds fewer events than asked, with a cursor to go on, so that a
	// filter matching few of many events cannot hold the service for long.
	// Defaults to 200,000.
	ScanBudget int
	// PageBytes caps the encoded size of one query page's events: a page
	// stops before it, with a cursor, whatever its limit, so that the reply
	// fits the broker's message limit. An event larger on its own comes
	// alone, its payload (and, if still too large, its message) cut.
	// Defaults to DefaultPageBytes.
	PageBytes int
	// MinFreeSpace is the room, in bytes, the store's file system must
	// have before Recover reopens a failed store. Defaults to
	// DefaultMinFreeSpace (64 MiB: a memtable's flush).
	MinFreeSpace uint64
}

// DefaultMinFreeSpace is StoreOptions.MinFreeSpace unless set.
const DefaultMinFreeSpace = 64 << 20

// DefaultPageBytes is StoreOptions.PageBytes unless set: room for a page
// and its envelope within the broker's default 1 MiB message limit.
const DefaultPageBytes = 1<<20 - 16<<10

// Store is the Pebble audit store. It is safe for concurrent use. After a
// failed write it refuses reads and writes with ErrUnavailable until Recover
// has reopened it.
type Store struct {
	dir  string
	opts StoreOptions

	mu     sync.RWMutex // write-held only to swap db
	db     *pebble.DB
	failed atomic.Pointer[error]
}

// OpenStore opens (or creates) the store in dir.
func OpenStore(dir string, opts StoreOptions) (*Store, error) {
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	opts.FS = cmp.Or(opts.FS, vfs.Default)
	opts.ScanBudget = cmp.Or(opts.ScanBudget, 200_000)
	opts.PageBytes = cmp.Or(opts.PageBytes, DefaultPageBytes)
	opts.MinFreeSpace = cmp.Or(opts.MinFreeSpace, DefaultMinFreeSpace)
	s := &Store{dir: dir, opts: opts}
	db, err := s.open()
	if err != nil {
		return nil, err
	}
	s.db = db
	return s, nil
}

func (s *Store) open() (db *pebble.DB, err error) {
	po := pebbleOptions(s.opts.FS, s.opts.Logger)
	defer po.Cache.Unref()
	err = guard(func() error {
		db, err = pebble.Open(s.dir, po)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open audit store %s: %w", s.dir, err)
	}
	return db, nil
}

// pebbleOptions are the store's Pebble options: a 32 MiB memtable (fewer,
// larger flushes for a write-mostly store) and a 64 MiB block cache. No
// bloom filters: every read is a range scan or a seek, which they do not
// serve. The caller unrefs the cache once the database is open.
func pebbleOptions(fs vfs.FS, log *slog.Logger) *pebble.Options {
	return &pebble.Options{
		FS:                 fs,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             &pebbleLogger{log: log},
		MemTableSize:       32 << 20,
		Cache:              pebble.NewCache(64 << 20),
	}
}

// Close closes the store.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	err := guard(s.db.Close)
	s.db = nil
	if err != nil && s.failed.Load() == nil {
		return fmt.Errorf("close audit store: %w", err)
	}
	return nil
}

// Recover reopens a failed store: Pebble's commit pipeline does not survive
// a write error, so the database is closed and opened again, replaying its
// write-ahead log. It does nothing on a healthy store.
func (s *Store) Recover() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed.Load() == nil {
		return nil
	}
	if s.db != nil {
		// Closing stops Pebble retrying its failed background work.
		if err := guard(s.db.Close); err != nil {
			s.opts.Logger.Debug("close failed audit store", "err", err)
		}
		s.db = nil
	}
	// Opening replays the write-ahead log into a flush: on a full disk it
	// would retry that flush forever, holding the store.
	if free, err := disk.Free(s.dir); err == nil && free < s.opts.MinFreeSpace {
		return fmt.Errorf("%w: %d bytes free in %s, want at least %d before reopening", ErrUnavailable, free, s.dir, s.opts.MinFreeSpace)
	}
	db, err := s.open()
	if err != nil {
		return err
	}
	s.db = db
	s.failed.Store(nil)
	return nil
}

// acquire returns the open database, held for reading until release, or
// ErrUnavailable at once: while the store is failed, and while it is being
// reopened or closed (a reopen can take long; a query must not wait for
// it and time out).
func (s *Store) acquire() (*pebble.DB, func(), error) {
	if errp := s.failed.Load(); errp != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUnavailable, *errp)
	}
	if !s.mu.TryRLock() {
		return nil, nil, fmt.Errorf("%w: being reopened", ErrUnavailable)
	}
	db, err := s.healthy()
	if err != nil {
		s.mu.RUnlock()
		return nil, nil, err
	}
	return db, s.mu.RUnlock, nil
}

// Err returns nil while the store can be written, and an error matching
// ErrUnavailable while it is failed or its file system has less than
// MinFreeSpace left.
func (s *Store) Err() error {
	if errp := s.failed.Load(); errp != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, *errp)
	}
	return s.room()
}

// room returns ErrUnavailable when the store's file system has less than
// MinFreeSpace left. Write checks it first: Pebble does not survive every
// write error (a failed rotation of its log ends the process), so it is
// never given a full disk to write to.
func (s *Store) room() error {
	free, err := disk.Free(s.dir)
	if err != nil || free >= s.opts.MinFreeSpace {
		return nil
	}
	return fmt.Errorf("%w: %d bytes free in %s, want at least %d: writes wait for room", ErrUnavailable, free, s.dir, s.opts.MinFreeSpace)
}

// healthy returns the open database, or ErrUnavailable. The caller holds
// s.mu for reading.
func (s *Store) healthy() (*pebble.DB, error) {
	if errp := s.failed.Load(); errp != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, *errp)
	}
	if s.db == nil {
		return nil, fmt.Errorf("%w: closed", ErrUnavailable)
	}
	return s.db, nil
}

func (s *Store) fail(err error) {
	s.failed.CompareAndSwap(nil, &err)
}

// Validate reports whether ev can be stored.
func Validate(ev *wire.Event) error {
	switch {
	case ev.ID == "":
		return fmt.Errorf("%w: no id", ErrInvalidEvent)
	case ev.Type == "":
		return fmt.Errorf("%w: no type", ErrInvalidEvent)
	case ev.Time.IsZero():
		return fmt.Errorf("%w: no time", ErrInvalidEvent)
	case ev.Time.Year() < 1700 || ev.Time.Year() > 2200:
		return fmt.Errorf("%w: time %s out of range", ErrInvalidEvent, ev.Time.Format(time.RFC3339))
	}
	for _, f := range []string{ev.ID, ev.TaskID, ev.ResourceID, ev.RouteID, ev.JobID, string(ev.Type), string(ev.Level)} {
		if bytes.IndexByte([]byte(f), 0) >= 0 {
			return fmt.Errorf("%w: a 0x00 byte in an id, type or level", ErrInvalidEvent)
		}
	}
	return nil
}

// Write stores events in one batch committed with fsync and returns how
// many it wrote. It refuses, with ErrUnavailable, while the file system has
// less than MinFreeSpace left. It is idempotent: an event is keyed by its time and id, so
// writing it again (a redelivered batch, a producer's retry) puts the same
// keys over themselves and adds nothing. Payloads are redacted again before
// they are stored. Every event must pass Validate. On a write error the
// store is failed until Recover.
func (s *Store) Write(events []wire.Event) (int, error) {
	for i := range events {
		if err := Validate(&events[i]); err != nil {
			return 0, err
		}
	}
	if len(events) == 0 {
		return 0, nil
	}
	if err := s.room(); err != nil {
		return 0, err
	}
	db, release, err := s.acquire()
	if err == nil {
		defer release()
	}
	if err != nil {
		return 0, err
	}
	b := db.NewBatch()
	defer b.Close()
	for i := range events {
		ev := &events[i]
		wire.RedactEvent(ev)
		val, err := json.Marshal(ev)
		if err != nil {
			return 0, fmt.Errorf("encode event %s: %w", ev.ID, err)
		}
		pk := primaryKey(ev.Time, ev.ID)
		if err := b.Set(pk, val, nil); err != nil {
			return 0, fmt.Errorf("batch event %s: %w", ev.ID, err)
		}
		suffix := pk[len(pk)-(8+len(ev.ID)):]
		for _, ix := range indexesOf(ev) {
			if err := b.Set(secondaryKey(ix.kind, ix.value, suffix), nil, nil); err != nil {
				return 0, fmt.Errorf("batch event %s: %w", ev.ID, err)
			}
		}
	}
	if err := guard(func() error { return b.Commit(pebble.Sync) }); err != nil {
		s.fail(err)
		return 0, fmt.Errorf("commit audit batch: %w", err)
	}
	return len(events), nil
}

// Query answers q: one page of matching events, oldest first, with a cursor
// when more match. It reads the secondary index of the most selective
// filter (task, resource, route, job, type, a level other than info, in
// that order) or, with none, the events themselves, and checks the other filters
// on each event.
func (s *Store) Query(q wire.AuditQuery) (wire.AuditPage, error) {
	plan, err := planQuery(q)
	if err != nil {
		return wire.AuditPage{}, err
	}
	db, release, err := s.acquire()
	if err == nil {
		defer release()
	}
	if err != nil {
		return wire.AuditPage{}, err
	}
	page := wire.AuditPage{Events: []wire.Event{}}
	err = guard(func() error { return plan.run(db, &page, s.opts.ScanBudget, s.opts.PageBytes) })
	if err != nil {
		return wire.AuditPage{}, fmt.Errorf("query audit store: %w", err)
	}
	return page, nil
}

// queryPlan is a query resolved into one key range.
type queryPlan struct {
	q     wire.AuditQuery
	kind  byte
	value string
	lower []byte // inclusive
	upper []byte // exclusive
}

func planQuery(q wire.AuditQuery) (*queryPlan, error) {
	switch {
	case q.Limit == 0:
		q.Limit = DefaultLimit
	case q.Limit < 0 || q.Limit > MaxLimit:
		return nil, fmt.Errorf("%w: limit %d out of range 1..%d", ErrBadQuery, q.Limit, MaxLimit)
	}
	p := &queryPlan{q: q, kind: kindEvent}
	for _, ix := range []index{
		{kindTask, q.TaskID}, {kindResource, q.ResourceID}, {kindRoute, q.RouteID},
		{kindJob, q.JobID}, {kindType, string(q.Type)}, {kindLevel, indexedLevel(q.Level)},
	} {
		if ix.value != "" {
			if bytes.IndexByte([]byte(ix.value), 0) >= 0 {
				return nil, fmt.Errorf("%w: a 0x00 byte in a filter", ErrBadQuery)
			}
			p.kind, p.value = ix.kind, ix.value
			break
		}
	}
	if p.kind == kindEvent {
		p.lower, p.upper = []byte{spaceEvents}, []byte{spaceEvents + 1}
	} else {
		p.lower = groupPrefix(0, p.kind, p.value)
		p.upper = prefixEnd(p.lower)
	}
	if q.Since != nil {
		if !inRange(*q.Since) {
			return nil, fmt.Errorf("%w: since %s out of range", ErrBadQuery, q.Since.Format(time.RFC3339))
		}
		p.lower = p.keyAt(timeBytes(*q.Since))
	}
	if q.Until != nil {
		if !inRange(*q.Until) {
			return nil, fmt.Errorf("%w: until %s out of range", ErrBadQuery, q.Until.Format(time.RFC3339))
		}
		if q.Since != nil && !q.Until.After(*q.Since) {
			return nil, fmt.Errorf("%w: until %s is not after since %s", ErrBadQuery,
				q.Until.Format(time.RFC3339Nano), q.Since.Format(time.RFC3339Nano))
		}
		p.upper = p.keyAt(timeBytes(*q.Until))
	}
	if q.Cursor != "" {
		c, err := base64.RawURLEncoding.DecodeString(q.Cursor)
		if err != nil || len(c) <= 8 || !inRange(timeOfBytes(c[:8])) {
			return nil, fmt.Errorf("%w: cursor %q is not one this service returned", ErrBadQuery, q.Cursor)
		}
		// Resume right after the cursor's (time, id).
		if after := append(p.keyAt(c), 0); bytes.Compare(after, p.lower) > 0 {
			p.lower = after
		}
	}
	return p, nil
}

// keyAt returns the plan's key for suffix, a <time>[<id>].
func (p *queryPlan) keyAt(suffix []byte) []byte {
	if p.kind == kindEvent {
		return primaryKeyFromSuffix(suffix)
	}
	return secondaryKey(p.kind, p.value, suffix)
}

func inRange(t time.Time) bool { return t.Year() >= 1700 && t.Year() <= 2200 }

// run fills page, walking the plan's key range in time order until the
// limit, the scan budget or the page's byte budget is reached. Index
// queries fetch each event, in the order the index names them, with a
// second iterator.
func (p *queryPlan) run(db *pebble.DB, page *wire.AuditPage, budget, pageBytes int) error {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: p.lower, UpperBound: p.upper})
	if err != nil {
		return err
	}
	defer it.Close()
	var events *pebble.Iterator
	if p.kind != kindEvent {
		if events, err = db.NewIter(&pebble.IterOptions{LowerBound: []byte{spaceEvents}, UpperBound: []byte{spaceEvents + 1}}); err != nil {
			return err
		}
		defer events.Close()
	}
	var last []byte // the last key's suffix done with
	scanned, size := 0, 0
	for valid := it.First(); valid; valid = it.Next() {
		if scanned == budget {
			page.Cursor = base64.RawURLEncoding.EncodeToString(last)
			return nil
		}
		scanned++
		suffix := suffixOf(it.Key(), p.kind)
		raw, found, err := p.event(it, events, suffix)
		if err != nil {
			return err
		}
		if !found {
			last = append(last[:0], suffix...)
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			return fmt.Errorf("decode stored event %x: %w", suffix, err)
		}
		if p.match(&ev) {
			// The stored JSON is what the reply encodes: its length, and
			// a comma, is what the event adds to the page.
			if len(page.Events) == p.q.Limit || len(page.Events) > 0 && size+len(raw)+1 > pageBytes {
				page.Cursor = base64.RawURLEncoding.EncodeToString(last)
				return nil
			}
			if len(raw) > pageBytes {
				cut(&ev, len(raw), pageBytes)
			}
			size += len(raw) + 1
			page.Events = append(page.Events, ev)
		}
		last = append(last[:0], suffix...)
	}
	return it.Error()
}

// cut makes an event of size bytes fit a page of pageBytes on its own: its
// payload becomes a JSON string saying what was left out, and its message
// is shortened if that is not enough. The store keeps the event whole.
func cut(ev *wire.Event, size, pageBytes int) {
	ev.Payload = json.RawMessage(fmt.Sprintf(`"[PAYLOAD OMITTED: the event is %d bytes, over a query page's %d]"`, size, pageBytes))
	if over := len(ev.Message) - pageBytes/2; over > 0 {
		ev.Message = ev.Message[:pageBytes/2] + "…[cut]"
	}
}

// suffixOf returns the <time><id> of an event key or an index key.
func suffixOf(key []byte, kind byte) []byte {
	if kind == kindEvent {
		return key[6:] // d <day:4> e
	}
	return key[bytes.IndexByte(key, 0)+1:] // x <kind> <value> 0x00
}

// event returns the stored event it points at: its value for an event
// scan, or the event its index key names, looked up with events.
func (p *queryPlan) event(it, events *pebble.Iterator, suffix []byte) ([]byte, bool, error) {
	if events == nil {
		raw, err := it.ValueAndErr()
		return raw, err == nil, err
	}
	pk := primaryKeyFromSuffix(suffix)
	if !events.SeekGE(pk) || !bytes.Equal(events.Key(), pk) {
		return nil, false, events.Error()
	}
	raw, err := events.ValueAndErr()
	return raw, err == nil, err
}

// match applies the query's field filters, as a live tail does.
func (p *queryPlan) match(ev *wire.Event) bool { return p.q.Matches(ev) }

// DeleteBefore removes every event older than cutoff and returns how many
// it removed: first the index keys of those events (point deletes, in
// synced batches), then the events themselves with one range delete, then a
// compaction of that range to give the disk back. Interrupted, it leaves
// nothing a query would return wrongly: an index key without its event is
// skipped, and the next run finishes the job.
func (s *Store) DeleteBefore(ctx context.Context, cutoff time.Time) (int, error) {
	if !inRange(cutoff) {
		return 0, nil
	}
	db, release, err := s.acquire()
	if err == nil {
		defer release()
	}
	if err != nil {
		return 0, err
	}
	var removed int
	err = guard(func() error {
		lo, hi := []byte{spaceEvents}, eventsBefore(cutoff)
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		defer it.Close()
		b := db.NewBatch()
		defer func() { _ = b.Close() }()
		for valid := it.First(); valid; valid = it.Next() {
			raw, err := it.ValueAndErr()
			if err != nil {
				return err
			}
			var ev wire.Event
			if err := json.Unmarshal(raw, &ev); err != nil {
				return fmt.Errorf("decode stored event: %w", err)
			}
			suffix := suffixOf(it.Key(), kindEvent)
			for _, ix := range indexesOf(&ev) {
				if err := b.Delete(secondaryKey(ix.kind, ix.value, suffix), nil); err != nil {
					return err
				}
			}
			removed++
			if b.Count() >= 10000 {
				if err := b.Commit(pebble.Sync); err != nil {
					return err
				}
				_ = b.Close()
				b = db.NewBatch()
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := it.Error(); err != nil {
			return err
		}
		if removed == 0 {
			return nil
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return err
		}
		if err := db.DeleteRange(lo, hi, pebble.Sync); err != nil {
			return err
		}
		return db.Compact(ctx, lo, hi, false)
	})
	if err != nil {
		return removed, fmt.Errorf("delete audit events before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return removed, nil
}

// Checkpoint writes a consistent copy of the store into dir, which must
// not exist yet; the copy opens with OpenStore.
func (s *Store) Checkpoint(dir string) error {
	db, release, err := s.acquire()
	if err == nil {
		defer release()
	}
	if err != nil {
		return err
	}
	if err := guard(func() error { return db.Checkpoint(dir, pebble.WithFlushedWAL()) }); err != nil {
		return fmt.Errorf("checkpoint audit store into %s: %w", dir, err)
	}
	return nil
}

// fatalError is what pebbleLogger.Fatalf panics with, so that guard can
// turn Pebble's fatal errors (a failed commit) into errors.
type fatalError struct{ msg string }

func (f fatalError) Error() string { return f.msg }

// guard runs f, turning a Pebble fatal error into an error.
func guard(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	return f()
}

// pebbleLogger sends Pebble's messages to slog; Fatalf panics with a
// fatalError instead of exiting. Errors are logged at most once a second,
// with how many were left out: a background flush failing on a full disk
// is retried, and reported, some ninety times a second.
type pebbleLogger struct {
	log *slog.Logger

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (l *pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug("pebble", "msg", fmt.Sprintf(format, args...))
}

func (l *pebbleLogger) Errorf(format string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last) < time.Second {
		l.dropped++
		l.mu.Unlock()
		return
	}
	dropped := l.dropped
	l.last, l.dropped = now, 0
	l.mu.Unlock()
	l.log.Error("pebble", "err", fmt.Sprintf(format, args...), "like_it_since_last", dropped)
}

func (l *pebbleLogger) Fatalf(format string, args ...any) {
	panic(fatalError{msg: fmt.Sprintf(format, args...)})
}
