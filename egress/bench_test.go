package egress

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

// BenchmarkRoutePick measures picking a route (what every http task with a
// route does) against the raw KV reads it is made of, in the same run.
func BenchmarkRoutePick(b *testing.B) {
	env := brokertest.Start(b)
	ctx := context.Background()
	store, err := NewStore(ctx, env.JS)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 5 {
		if _, err := store.Put(ctx, wire.Route{ID: fmt.Sprintf("r%d", i), State: wire.RouteAvailable, Score: float64(90 + i), Proxy: "direct"}); err != nil {
			b.Fatal(err)
		}
	}
	picker, err := NewPicker(ctx, PickerConfig{}, env.NC, env.JS)
	if err != nil {
		b.Fatal(err)
	}
	defer picker.Close()
	raw, err := env.JS.KeyValue(ctx, wire.BucketRoutes)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("raw_kv_get", func(b *testing.B) {
		for b.Loop() {
			if _, err := raw.Get(ctx, "r1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("named", func(b *testing.B) {
		for b.Loop() {
			if _, err := picker.Pick(ctx, "r1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw_kv_watchall_5", func(b *testing.B) {
		for b.Loop() {
			w, err := raw.WatchAll(ctx, jetstream.IgnoreDeletes())
			if err != nil {
				b.Fatal(err)
			}
			for e := range w.Updates() {
				if e == nil {
					break
				}
			}
			_ = w.Stop()
		}
	})
	b.Run("auto_5", func(b *testing.B) {
		for b.Loop() {
			if _, err := picker.Pick(ctx, wire.RouteAuto); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRouteRequest measures a GET through a route (pick, then the
// request through a local HTTP proxy on a kept-alive connection) against
// the same GET on a plain direct transport: to an http target (forwarded
// by the proxy) and to an https one (through a CONNECT tunnel).
func BenchmarkRouteRequest(b *testing.B) {
	env := brokertest.Start(b)
	ctx := context.Background()
	srv := target(b)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	b.Cleanup(tlsSrv.Close)
	tlsConfig := tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig
	p := proxytest.Start(b, proxytest.HTTPConnect)
	store, err := NewStore(ctx, env.JS)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := store.Put(ctx, wire.Route{ID: "p", State: wire.RouteAvailable, Score: 99, Proxy: p.URL()}); err != nil {
		b.Fatal(err)
	}
	picker, err := NewPicker(ctx, PickerConfig{}, env.NC, env.JS)
	if err != nil {
		b.Fatal(err)
	}
	defer picker.Close()
	do := func(b *testing.B, rt http.RoundTripper, url string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.Run("raw_direct", func(b *testing.B) {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		for b.Loop() {
			do(b, tr, srv.URL)
		}
	})
	b.Run("route_http", func(b *testing.B) {
		for b.Loop() {
			rt, _, err := picker.Transport(ctx, "p")
			if err != nil {
				b.Fatal(err)
			}
			do(b, rt, srv.URL)
		}
	})
	b.Run("raw_direct_tls", func(b *testing.B) {
		tr := &http.Transport{TLSClientConfig: tlsConfig}
		defer tr.CloseIdleConnections()
		for b.Loop() {
			do(b, tr, tlsSrv.URL)
		}
	})
	b.Run("route_https", func(b *testing.B) {
		// The picker's transports trust the system roots only: the
		// route's transport is made here, with the test server's.
		tr, err := NewTransport(p.URL(), nil)
		if err != nil {
			b.Fatal(err)
		}
		tr.TLSClientConfig = tlsConfig
		defer tr.CloseIdleConnections()
		for b.Loop() {
			if _, err := picker.Pick(ctx, "p"); err != nil {
				b.Fatal(err)
			}
			do(b, tr, tlsSrv.URL)
		}
	})
}
