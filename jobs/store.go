package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/kv"
)

// Sentinel errors of the job store, checked with errors.Is; each matches
// its kv counterpart.
var (
	// ErrNotFound is returned for a job name absent from gantry_jobs.
	ErrNotFound = kv.Sentinel("job not found", kv.ErrNotFound)
	// ErrExists is returned by Store.Create when the name is taken.
	ErrExists = kv.Sentinel("job already exists", kv.ErrExists)
	// ErrChanged is returned by Store.Update when the job changed since it
	// was read.
	ErrChanged = kv.Sentinel("job changed meanwhile", kv.ErrChanged)
)

// Store is the typed store of scheduled jobs in wire.BucketJobs: one
// wire.Job per key, the key being the job's name.
type Store struct {
	kv jetstream.KeyValue
}

// NewStore opens the jobs bucket, which the broker provisions.
func NewStore(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	b, err := kv.Open(ctx, js, wire.BucketJobs)
	if err != nil {
		return nil, err
	}
	return &Store{kv: b}, nil
}

// KeyValue returns the underlying bucket, for watching.
func (s *Store) KeyValue() jetstream.KeyValue { return s.kv }

// Get returns the job named name and its revision.
func (s *Store) Get(ctx context.Context, name string) (wire.Job, uint64, error) {
	if !wire.ValidJobName(name) {
		return wire.Job{}, 0, fmt.Errorf("job %q: %w", name, ErrNotFound)
	}
	e, err := s.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.Job{}, 0, fmt.Errorf("job %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return wire.Job{}, 0, fmt.Errorf("get job %s: %w", name, err)
	}
	j, err := Decode(name, e.Value())
	if err != nil {
		return wire.Job{}, 0, fmt.Errorf("job %s: %w", name, err)
	}
	return j, e.Revision(), nil
}

// Decode decodes the job stored under key. A job written without a name
// (as `nats kv put gantry_jobs tick '{"type":"noop","every":"1m"}'` does)
// is named by its key; a name that differs from the key is an error
// matching ErrInvalid.
func Decode(key string, data []byte) (wire.Job, error) {
	var j wire.Job
	if err := json.Unmarshal(data, &j); err != nil {
		return wire.Job{}, fmt.Errorf("%w %q: decode: %v", ErrInvalid, key, err)
	}
	if j.Name == "" {
		j.Name = key
	}
	if j.Name != key {
		return wire.Job{}, fmt.Errorf("%w: key %q holds a job named %q", ErrInvalid, key, j.Name)
	}
	return j, nil
}

// Create stores j under its name if no job has that name yet.
func (s *Store) Create(ctx context.Context, j wire.Job) (uint64, error) {
	data, err := json.Marshal(j)
	if err != nil {
		return 0, fmt.Errorf("encode job %s: %w", j.Name, err)
	}
	rev, err := s.kv.Create(ctx, j.Name, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("job %q: %w", j.Name, ErrExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create job %s: %w", j.Name, err)
	}
	return rev, nil
}

// Update stores j if the job's revision is still rev; it fails with
// ErrChanged otherwise.
func (s *Store) Update(ctx context.Context, j wire.Job, rev uint64) (uint64, error) {
	data, err := json.Marshal(j)
	if err != nil {
		return 0, fmt.Errorf("encode job %s: %w", j.Name, err)
	}
	rev, err = s.kv.Update(ctx, j.Name, data, rev)
	if kv.Conflict(err) {
		return 0, fmt.Errorf("job %q: %w", j.Name, ErrChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("update job %s: %w", j.Name, err)
	}
	return rev, nil
}

// Modify reads the job named name, applies fn and writes the result back by
// compare-and-swap, retrying when another writer got in between.
func (s *Store) Modify(ctx context.Context, name string, fn func(*wire.Job) error) (wire.Job, error) {
	for {
		j, rev, err := s.Get(ctx, name)
		if err != nil {
			return wire.Job{}, err
		}
		if err := fn(&j); err != nil {
			return wire.Job{}, err
		}
		_, err = s.Update(ctx, j, rev)
		if errors.Is(err, ErrChanged) {
			continue
		}
		if err != nil {
			return wire.Job{}, err
		}
		return j, nil
	}
}

// Delete removes the job named name.
func (s *Store) Delete(ctx context.Context, name string) error {
	if _, _, err := s.Get(ctx, name); err != nil {
		return err
	}
	if err := s.kv.Delete(ctx, name); err != nil {
		return fmt.Errorf("delete job %s: %w", name, err)
	}
	return nil
}

// List returns every job, sorted by name. A value that does not decode is
// reported in bad, by key, rather than failing the listing.
func (s *Store) List(ctx context.Context) (jobs []wire.Job, bad map[string]error, err error) {
	entries, err := kv.Entries(ctx, s.kv, "")
	if err != nil {
		return nil, nil, fmt.Errorf("list jobs: %w", err)
	}
	for _, e := range entries {
		j, err := Decode(e.Key(), e.Value())
		if err != nil {
			if bad == nil {
				bad = map[string]error{}
			}
			bad[e.Key()] = err
			continue
		}
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].Name < jobs[j].Name })
	return jobs, bad, nil
}
