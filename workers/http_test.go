package workers

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/proxytest"
)

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// proxyPicker is a RoutePicker with one route through a real CONNECT proxy.
type proxyPicker struct {
	proxy   *url.URL
	tls     *tls.Config
	reports atomic.Int32
}

func (p *proxyPicker) Transport(_ context.Context, route string) (http.RoundTripper, string, error) {
	return &http.Transport{Proxy: http.ProxyURL(p.proxy), TLSClientConfig: p.tls}, "office", nil
}

func (p *proxyPicker) Report(context.Context, string, error) { p.reports.Add(1) }

func TestHTTP(t *testing.T) {
	t.Parallel()
	var limited, flaky atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte("fine"))
		case "/limited":
			if limited.Add(1) == 1 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
		case "/flaky":
			if flaky.Add(1) == 1 {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	proxy := proxytest.Start(t, proxytest.HTTPConnect)
	pu, _ := url.Parse(proxy.URL())
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("via route")) }))
	t.Cleanup(tlsSrv.Close)
	picker := &proxyPicker{proxy: pu, tls: tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig}

	b := setup(t)
	b.start(t, Config{Policy: fastPolicy, Routes: picker}, nil)
	subj := wire.TaskSubject("", "http")
	task := func(id string, p wire.HTTPPayload) string {
		s, _ := jsonString(p)
		return `{"id":"` + id + `","payload":` + s + `}`
	}
	b.publish(t, subj, task("ok", wire.HTTPPayload{URL: srv.URL + "/ok"}))
	if rec := b.waitState(t, "ok", wire.TaskSucceeded, 10*time.Second); rec.Output != "fine" {
		t.Errorf("output = %q, want fine", rec.Output)
	}
	b.publish(t, subj, task("limited", wire.HTTPPayload{URL: srv.URL + "/limited"}))
	b.waitState(t, "limited", wire.TaskRetryWait, 10*time.Second)
	rec := b.waitState(t, "limited", wire.TaskSucceeded, 10*time.Second)
	if rec.Attempts != 1 || rec.Delays != 1 {
		t.Errorf("429: attempts = %d, delays = %d, want 1 and 1", rec.Attempts, rec.Delays)
	}
	retry := b.waitEvents(t, "limited", wire.EventRetryScheduled, 1, 5*time.Second)
	if d := payload(t, retry[0])["delay"]; d != "1s" {
		t.Errorf("429 retry delay = %v, want 1s (Retry-After)", d)
	}
	b.publish(t, subj, task("flaky", wire.HTTPPayload{URL: srv.URL + "/flaky"}))
	if rec := b.waitState(t, "flaky", wire.TaskSucceeded, 10*time.Second); rec.Attempts != 2 {
		t.Errorf("502: attempts = %d, want 2", rec.Attempts)
	}
	b.publish(t, subj, task("missing", wire.HTTPPayload{URL: srv.URL + "/missing"}))
	if rec := b.waitState(t, "missing", wire.TaskNeedsReview, 10*time.Second); rec.Attempts != 1 || !strings.Contains(rec.LastError, "404") {
		t.Errorf("404: attempts = %d, last error %q, want 1 and 404", rec.Attempts, rec.LastError)
	}
	b.publish(t, subj, task("bad-url", wire.HTTPPayload{URL: "ftp://x"}))
	b.waitState(t, "bad-url", wire.TaskNeedsReview, 10*time.Second)

	b.publish(t, subj, task("routed", wire.HTTPPayload{URL: tlsSrv.URL + "/", Route: "auto"}))
	if rec := b.waitState(t, "routed", wire.TaskSucceeded, 10*time.Second); rec.Output != "via route" {
		t.Errorf("routed output = %q, want via route", rec.Output)
	}
	if proxy.Tunnels() == 0 || picker.reports.Load() == 0 {
		t.Errorf("proxy tunnels = %d, reports = %d; want the request through the route's proxy, reported", proxy.Tunnels(), picker.reports.Load())
	}
}

func TestHTTPRouteWithoutPicker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{}, nil)
	b.publish(t, wire.TaskSubject("", "http"), `{"id":"r1","payload":{"url":"http://127.0.0.1:1/","route":"office"}}`)
	rec := b.waitState(t, "r1", wire.TaskNeedsReview, 10*time.Second)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, "no egress routes") {
		t.Errorf("attempts = %d, last error %q, want 1 and no egress routes", rec.Attempts, rec.LastError)
	}
}
