package egress_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/kv"
)

// FuzzRouteValue writes any bytes, as any client can, into a route's key
// of a real broker's bucket (docs/RELIABILITY.md, "Fuzzing"): Get answers
// a route that round-trips or an error matching kv.ErrBadValue, and List
// still answers.
func FuzzRouteValue(f *testing.F) {
	f.Add([]byte(`{"id":"fz","state":"HEALTHY","kind":"direct"}`))
	f.Add([]byte(`{"id":"fz","state":"QUARANTINED","failures":3}`))
	f.Add([]byte(`{"failures":"x"}`))
	f.Add([]byte(`nul`))
	env := brokertest.Start(f)
	ctx := context.Background()
	s, err := egress.NewStore(ctx, env.JS)
	if err != nil {
		f.Fatal(err)
	}
	b, err := env.JS.KeyValue(ctx, wire.BucketRoutes)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.Put(ctx, "fz", data); err != nil {
			t.Fatal(err)
		}
		r, _, err := s.Get(ctx, "fz")
		if err != nil && !errors.Is(err, kv.ErrBadValue) {
			t.Fatalf("Get over %q = %v, want a route or ErrBadValue", data, err)
		}
		if err == nil {
			enc, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("encode %+v: %v", r, err)
			}
			var again wire.Route
			if err := json.Unmarshal(enc, &again); err != nil {
				t.Fatalf("decode %s: %v", enc, err)
			}
			if enc2, _ := json.Marshal(again); string(enc2) != string(enc) {
				t.Fatalf("round trip of %s = %s", enc, enc2)
			}
		}
		if _, err := s.List(ctx); err != nil {
			t.Fatalf("List over %q = %v", data, err)
		}
	})
}
