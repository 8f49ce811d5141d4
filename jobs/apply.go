package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Apply normalizes and validates j, then writes it into the store: a new
// job is created, a changed one updated, an unchanged one left alone. An
// existing job keeps its Paused flag, so a pause done by an operator
// survives a restart and a re-add; j.Paused only applies when the job is
// created. It returns the job as stored. The config file, 'gantry job add'
// and any Go client apply jobs through it.
func Apply(ctx context.Context, store *Store, j wire.Job, now time.Time) (wire.Job, error) {
	j, err := Normalize(j)
	if err != nil {
		return wire.Job{}, err
	}
	for {
		cur, rev, err := store.Get(ctx, j.Name)
		if errors.Is(err, ErrNotFound) {
			j.CreatedAt, j.UpdatedAt = now, now
			if _, err = store.Create(ctx, j); errors.Is(err, ErrExists) {
				continue
			}
			if err != nil {
				return wire.Job{}, err
			}
			return j, nil
		}
		if err != nil {
			return wire.Job{}, err
		}
		if SameDefinition(cur, j) {
			return cur, nil
		}
		next := j
		next.Paused = cur.Paused
		next.CreatedAt, next.UpdatedAt = cur.CreatedAt, now
		if _, err = store.Update(ctx, next, rev); errors.Is(err, ErrChanged) {
			continue
		}
		if err != nil {
			return wire.Job{}, err
		}
		return next, nil
	}
}

// SameDefinition reports whether a and b define the same job, ignoring
// Paused, Source and the timestamps.
func SameDefinition(a, b wire.Job) bool {
	a.Paused, b.Paused = false, false
	a.Source, b.Source = "", ""
	a.CreatedAt, b.CreatedAt = time.Time{}, time.Time{}
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	ea, err1 := json.Marshal(a)
	eb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ea) == string(eb)
}
