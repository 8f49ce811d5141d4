package healthd

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

// BenchmarkRecord measures what healthd does with one outcome (score,
// transition, a KV put of the route) against a raw KV put of the same
// value, in the same run.
func BenchmarkRecord(b *testing.B) {
	env := brokertest.Start(b)
	ctx := context.Background()
	h, err := New(Config{Logger: env.Log}, env.NC, env.JS)
	if err != nil {
		b.Fatal(err)
	}
	if h.store, err = egress.NewStore(ctx, env.JS); err != nil {
		b.Fatal(err)
	}
	r := &route{spec: config.Route{ID: "r"}, state: wire.Route{ID: "r", State: wire.RouteAvailable, Score: 100, Proxy: "direct"}}
	raw, err := env.JS.KeyValue(ctx, wire.BucketRoutes)
	if err != nil {
		b.Fatal(err)
	}
	data, _ := json.Marshal(r.state)
	b.Run("raw_kv_put", func(b *testing.B) {
		for b.Loop() {
			if _, err := raw.Put(ctx, "raw", data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("record", func(b *testing.B) {
		for b.Loop() {
			h.record(ctx, r, outcome{ok: true, probe: true, measured: true, latencyMS: 20}, nil)
		}
	})
}

// BenchmarkProbe measures one probe of a route without an exit check
// (stage 1, a TCP connect to the proxy; stage 2, a GET through a fresh
// CONNECT tunnel) against a raw GET through the same proxy on a fresh
// connection.
func BenchmarkProbe(b *testing.B) {
	env := brokertest.Start(b)
	srv := site(b, http.StatusOK)
	p := proxytest.Start(b, proxytest.HTTPConnect)
	h, err := New(Config{Logger: env.Log}, env.NC, env.JS)
	if err != nil {
		b.Fatal(err)
	}
	spec := config.Route{ID: "r", Proxy: p.URL(), ProbeURL: srv.URL}
	ctx := context.Background()
	b.Run("raw_get_via_proxy", func(b *testing.B) {
		tr, err := egress.NewTransport(p.URL(), nil)
		if err != nil {
			b.Fatal(err)
		}
		tr.DisableKeepAlives = true
		client := &http.Client{Transport: tr}
		for b.Loop() {
			resp, err := client.Get(srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	})
	b.Run("probe", func(b *testing.B) {
		for b.Loop() {
			if res := h.probe(ctx, spec); !res.OK {
				b.Fatal(res.Error)
			}
		}
	})
}
