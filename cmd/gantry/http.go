package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// check is one readiness condition; nil means ready.
type check func(ctx context.Context) error

// httpServer serves /healthz, /readyz and /metrics, and /debug/pprof/ on
// loopback.
type httpServer struct {
	log    *slog.Logger
	ln     net.Listener
	srv    *http.Server
	mux    *http.ServeMux
	mu     sync.Mutex
	checks map[string]check
}

// newHTTPServer listens on addr at once, so that a busy port fails the start
// rather than a later moment.
func newHTTPServer(addr string, log *slog.Logger, reg *prometheus.Registry) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http listen: %w", err)
	}
	h := &httpServer{log: log, ln: ln, checks: map[string]check{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg,
	}))
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		addProfiles(mux)
	}
	h.mux = mux
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return h, nil
}

// addProfiles serves the Go runtime's profiles (heap, goroutines, CPU,
// allocations) under /debug/pprof/, as Prometheus and nats-server do. Only
// on a loopback listener: a profile shows what the process holds, and
// taking one costs the process time, so beyond loopback it is not offered.
func addProfiles(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// addCheck adds a readiness condition under name.
func (h *httpServer) addCheck(name string, c check) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks[name] = c
}

func (h *httpServer) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	h.mu.Lock()
	checks := make(map[string]check, len(h.checks))
	for k, v := range h.checks {
		checks[k] = v
	}
	h.mu.Unlock()
	status := http.StatusOK
	body := ""
	for name, c := range checks {
		if err := c(ctx); err != nil {
			status = http.StatusServiceUnavailable
			body += fmt.Sprintf("%s: %v\n", name, err)
		}
	}
	if status == http.StatusOK {
		body = "ready\n"
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// Addr is the address the server listens on.
func (h *httpServer) Addr() string { return h.ln.Addr().String() }

// Run serves until Stop.
func (h *httpServer) Run() error {
	if err := h.srv.Serve(h.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http serve: %w", err)
	}
	return nil
}

// Stop shuts the server down, letting requests in flight finish for up to 2s.
func (h *httpServer) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
}
