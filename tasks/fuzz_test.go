package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
	"github.com/gantry-dev/gantry/tasks"
)

// The fuzz targets of the task buckets write any bytes, as any client can,
// into a key of a real broker's bucket and read it back through the store
// (docs/RELIABILITY.md, "Fuzzing").

// FuzzTaskRecordValue: a task record is read back as one that round-trips,
// or as an error matching kv.ErrBadValue.
func FuzzTaskRecordValue(f *testing.F) {
	f.Add([]byte(`{"id":"fz","state":"SUCCEEDED","queue":"default","type":"noop","attempt":1}`))
	f.Add([]byte(`{"id":"fz","state":"RUNNING","not_before":"2026-12-01T00:00:00Z"}`))
	f.Add([]byte(`{"attempt":-1}`))
	f.Add([]byte(`null`))
	f.Add([]byte("\xff"))
	env := brokertest.Start(f)
	ctx := context.Background()
	s, err := tasks.NewStore(ctx, env.JS, tasks.StoreConfig{})
	if err != nil {
		f.Fatal(err)
	}
	b, err := env.JS.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Put(ctx, "fz", data); err != nil {
			t.Fatal(err)
		}
		rec, _, err := s.Get(ctx, "fz")
		if err != nil {
			if !errors.Is(err, kv.ErrBadValue) {
				t.Fatalf("Get over %q = %v, want a record or ErrBadValue", data, err)
			}
			return
		}
		roundTrip(t, rec)
		if _, err := s.List(ctx, nil); err != nil {
			t.Fatalf("List over %q = %v", data, err)
		}
	})
}

// FuzzCheckpointValue: a checkpoint is read back as one that round-trips,
// or as none (the task starts over).
func FuzzCheckpointValue(f *testing.F) {
	f.Add([]byte(`{"data":{"page":3},"saved_at":"2026-12-01T00:00:00Z"}`))
	f.Add([]byte(`{"data":null}`))
	f.Add([]byte(`"x"`))
	f.Add([]byte(``))
	env := brokertest.Start(f)
	ctx := context.Background()
	s, err := tasks.NewCheckpointStore(ctx, env.JS)
	if err != nil {
		f.Fatal(err)
	}
	if err := s.Save(ctx, "fz", wire.Checkpoint{}); err != nil {
		f.Fatal(err)
	}
	key, err := onlyKey(ctx, env)
	if err != nil {
		f.Fatal(err)
	}
	b, err := env.JS.KeyValue(ctx, wire.BucketCheckpoints)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
		cp, err := s.Load(ctx, "fz")
		if err != nil {
			t.Fatalf("Load over %q = %v, want a checkpoint or none", data, err)
		}
		if cp != nil {
			roundTrip(t, *cp)
		}
	})
}

// onlyKey returns the one key of the checkpoint bucket: where the store
// keeps task fz's checkpoint.
func onlyKey(ctx context.Context, env *brokertest.Env) (string, error) {
	b, err := env.JS.KeyValue(ctx, wire.BucketCheckpoints)
	if err != nil {
		return "", err
	}
	keys, err := b.ListKeys(ctx)
	if err != nil {
		return "", err
	}
	var out []string
	for k := range keys.Keys() {
		out = append(out, k)
	}
	if len(out) != 1 {
		return "", errors.New("want exactly one checkpoint key")
	}
	return out[0], nil
}

// FuzzQueueState: any bytes in a queue's state key decode to a state.
func FuzzQueueState(f *testing.F) {
	f.Add([]byte(`{"queue":"default","paused":true}`))
	f.Add([]byte(`{"paused":"yes"}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st := tasks.DecodeQueueState("default", data)
		if st.Queue != "default" {
			t.Fatalf("queue = %q, want default", st.Queue)
		}
	})
}

// roundTrip fails t unless v's encoding decodes to a value that encodes
// the same.
func roundTrip[T any](t *testing.T, v T) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode %+v: %v", v, err)
	}
	var again T
	if err := json.Unmarshal(data, &again); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	data2, err := json.Marshal(again)
	if err != nil {
		t.Fatalf("encode %+v: %v", again, err)
	}
	if string(data2) != string(data) {
		t.Fatalf("round trip of %s = %s", data, data2)
	}
}
