package kv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The shared error vocabulary. Each domain wraps these into sentinels of
// its own (tasks.ErrNotFound is "task not found" and matches ErrNotFound).
var (
	// ErrNotFound: no such key.
	ErrNotFound = errors.New("not found")
	// ErrExists: a create found the key taken.
	ErrExists = errors.New("already exists")
	// ErrChanged: a compare-and-swap found the key at another revision.
	ErrChanged = errors.New("changed meanwhile")
	// ErrInvalid: bad input, refused before anything was written.
	ErrInvalid = errors.New("invalid input")
	// ErrConflict: refused because of what someone else holds or runs now
	// (a lease of another owner, an unfinished run of a job that forbids
	// overlap); nothing was taken over.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: whoever should answer cannot now (no service
	// answers, a store has failed, a resource is out of service); trying
	// again later may succeed.
	ErrUnavailable = errors.New("unavailable")
)

// Sentinel returns a sentinel error whose message is msg and that matches
// kind (one of the vocabulary above) with errors.Is: how a domain names
// its own errors, e.g. Sentinel("task not found", ErrNotFound).
func Sentinel(msg string, kind error) error { return &sentinel{msg: msg, kind: kind} }

type sentinel struct {
	msg  string
	kind error
}

func (s *sentinel) Error() string        { return s.msg }
func (s *sentinel) Is(target error) bool { return target == s.kind }

// Conflict reports whether err is the broker refusing a write because the
// key's last revision is not the expected one. A single server answers
// 10071 (which nats.go maps to both ErrKeyRevisionMismatch and
// ErrKeyExists); a replicated stream can answer 10164.
func Conflict(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// ErrWatcherClosed is returned by Entries when the watcher closed before it
// reached the end of the bucket: a partial list is never returned.
var ErrWatcherClosed = errors.New("watcher closed before the end of the bucket")

// Entries returns the live entries of b (of the keys matching filter, or
// every key when filter is empty), read in one pass of a watcher up to the
// bucket's current end. Deletes and purges are skipped.
func Entries(ctx context.Context, b jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	var (
		w   jetstream.KeyWatcher
		err error
	)
	if filter == "" {
		w, err = b.WatchAll(ctx, jetstream.IgnoreDeletes())
	} else {
		w, err = b.Watch(ctx, filter, jetstream.IgnoreDeletes())
	}
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", b.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read %s: %w", b.Bucket(), ErrWatcherClosed)
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s: %w", b.Bucket(), ctx.Err())
		}
	}
}

// Open returns the bucket named bucket, which the broker provisions: the
// first step of every store's constructor.
func Open(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	b, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	return b, nil
}

// List returns the live values of b (read by Entries), each made by decode
// from its entry, sorted by cmp. An entry decode refuses (ok false) is left
// out.
func List[T any](ctx context.Context, b jetstream.KeyValue, decode func(jetstream.KeyValueEntry) (v T, ok bool), cmp func(a, b T) int) ([]T, error) {
	entries, err := Entries(ctx, b, "")
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(entries))
	for _, e := range entries {
		if v, ok := decode(e); ok {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, cmp)
	return out, nil
}

// Subject is the subject a write of key in bucket is published on.
func Subject(bucket, key string) string { return "$KV." + bucket + "." + key }

// Msg returns a put of data under key in bucket as a message to publish,
// with a per-message TTL of ttl rounded up to whole seconds (the broker's
// unit) when ttl > 0. Publish it with jetstream.WithExpectLastSequencePerSubject
// for a compare-and-swap: unlike KV's Update, it keeps the TTL.
func Msg(bucket, key string, data []byte, ttl time.Duration) *nats.Msg {
	m := &nats.Msg{Subject: Subject(bucket, key), Data: data}
	if ttl > 0 {
		m.Header = nats.Header{jetstream.MsgTTLHeader: []string{strconv.FormatInt(int64(TTLSeconds(ttl)/time.Second), 10)}}
	}
	return m
}

// TTLSeconds returns ttl as the broker applies it: whole seconds, rounded
// up, at least 1 s. It returns 0 for ttl <= 0.
func TTLSeconds(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return 0
	}
	return max(time.Second, (ttl+time.Second-1)/time.Second*time.Second)
}

// Transient reports whether err may pass if the call is made again: a
// time-out (a request lost with a broker that died), no responder, no
// stream (a stream electing a new leader), or a cluster still forming.
func Transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// Retry runs op with a deadline of try, again while it fails with a
// Transient error, until ctx ends: a store call that rides out a broker
// restarting or a cluster electing a new leader. op must be safe to make
// again.
func Retry(ctx context.Context, try time.Duration, op func(context.Context) error) error {
	wait := 50 * time.Millisecond
	for {
		tctx, cancel := context.WithTimeout(ctx, try)
		err := op(tctx)
		cancel()
		if err == nil || !Transient(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Marker reports whether a message of a KV bucket's stream, by its
// headers, is a delete, purge or expiry marker rather than a value.
func Marker(h nats.Header) bool {
	return h.Get(kvOperationHeader) != "" || h.Get(jetstream.MarkerReasonHeader) != ""
}

// kvOperationHeader marks KV delete and purge markers (KV-Operation: DEL or
// PURGE), as the KV protocol defines.
const kvOperationHeader = "KV-Operation"

// CheckTTL reports why a value written with headers h would hold its key
// longer than max: no per-message TTL (it never expires), one that cannot
// be read, "never", or one over max. It is nil for a TTL from 1 s to max.
// Every lease-like value gantry writes carries one (Msg, KeyTTL): a value
// without is forged.
func CheckTTL(h nats.Header, max time.Duration) error {
	v := h.Get(jetstream.MsgTTLHeader)
	if v == "" {
		return errors.New("written without a TTL: it would never expire")
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.ParseInt(v, 10, 64)
		if nerr != nil {
			return fmt.Errorf("TTL %q is not a duration", v)
		}
		if n > int64(max/time.Second) {
			return fmt.Errorf("TTL %s: want 1s to %v", v, max)
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 || d > max {
		return fmt.Errorf("TTL %s: want 1s to %v", v, max)
	}
	return nil
}
