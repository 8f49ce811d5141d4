package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/client"
)

// process composes the actors of one gantry process: every component's Run
// and Stop, HTTP, and the signal handler, in one run.Group.
type process struct {
	log *slog.Logger
	// reg is the process's Prometheus registry, served on /metrics: every
	// component registers its metrics on it.
	reg   *prometheus.Registry
	g     run.Group
	ready []<-chan struct{}
	attrs []any
	http  *httpServer
	conns []*nats.Conn
	// httpTLS, when set, makes HTTP serve TLS.
	httpTLS *tls.Config
}

func newProcess(log *slog.Logger) *process { return &process{log: log, reg: newRegistry()} }

// addSignals ends the group on SIGINT or SIGTERM.
func (p *process) addSignals(ctx context.Context) {
	p.g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
}

// addHTTP serves /healthz, /readyz and /metrics on addr, unless addr is
// empty. Readiness includes the broker answering JetStream requests.
func (p *process) addHTTP(addr string, nc *nats.Conn) error {
	if addr == "" {
		return nil
	}
	h, err := newHTTPServer(addr, p.log.With("component", "http"), p.reg)
	if err != nil {
		return listenError("--http-listen", "HTTP_LISTEN", err)
	}
	if p.httpTLS != nil {
		h.ln = tls.NewListener(h.ln, p.httpTLS)
	}
	if nc != nil {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		h.addCheck("nats", func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("cut off from the broker (%s)", nc.Status())
			}
			return nil
		})
		h.addCheck("jetstream", func(ctx context.Context) error {
			_, err := js.AccountInfo(ctx)
			return err
		})
	}
	p.http = h
	p.g.Add(h.Run, func(error) { h.Stop() })
	p.attrs = append(p.attrs, "http", "http://"+h.Addr())
	return nil
}

// addSystemMetrics adds the system collector (client.Stats as metrics) to
// the process's registry, when it serves HTTP.
func (p *process) addSystemMetrics(nc *nats.Conn) error {
	if p.http == nil {
		return nil
	}
	c, err := client.New(nc, client.WithComponent("http"), client.WithLogger(p.log.With("component", "http")))
	if err != nil {
		return err
	}
	return p.reg.Register(newSystemCollector(c.Stats))
}

// checkComponentHTTP refuses a component's --http-listen beyond loopback
// unless the process authenticates, as the broker's listeners need.
func (a *app) checkComponentHTTP(addr string) error {
	if addr != "" && !broker.IsLoopback(hostOf(addr)) && !a.client.authenticated() {
		return withCode(exitUsage, fmt.Errorf("%w: --http-listen %q is not a loopback address; connect with credentials (--user, --nkey, --creds or a TLS certificate) or listen on 127.0.0.1", broker.ErrInsecureListen, addr))
	}
	return nil
}

// addComponentHTTP serves a component process's /healthz, /readyz and
// /metrics on addr, unless it is empty: /readyz fails while the process is
// cut off from the broker.
func (a *app) addComponentHTTP(p *process, addr string, nc *nats.Conn) error {
	if addr == "" {
		return nil
	}
	return p.addHTTP(addr, nc)
}

// connect opens an in-process connection for one component, closed when the
// process ends.
func (p *process) connect(b *broker.Broker, component string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := b.Connect("gantry-" + component)
	if err != nil {
		return nil, nil, err
	}
	p.conns = append(p.conns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// actor is a component with the Run/Stop contract.
type actor interface {
	Run(ctx context.Context) error
	Stop()
}

// addActor adds a component to the group. Its context ends when the group
// has been interrupted and the component has had stopGrace to drain.
func (p *process) addActor(name string, a actor) {
	ctx, cancel := context.WithCancel(context.Background())
	p.g.Add(func() error {
		if err := a.Run(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}, func(error) {
		a.Stop()
		time.AfterFunc(stopGrace, cancel)
	})
	if r, ok := a.(interface{ Ready() <-chan struct{} }); ok {
		p.ready = append(p.ready, r.Ready())
	}
	// /readyz reports a component that cannot work (its consumer is being
	// recreated, its store has failed).
	if h, ok := a.(interface{ Healthy() error }); ok && p.http != nil {
		p.http.addCheck(name, func(context.Context) error { return h.Healthy() })
	}
}

// stopGrace is how long a component may drain after Stop before its
// context is cancelled; it keeps the whole shutdown within 10 s.
const stopGrace = 7 * time.Second

// readyMsg is the message of the one log line that says a gantry process
// serves: clients can connect and every component runs. Nothing else logs
// it (nats-server's own "Server is ready" goes to debug).
const readyMsg = "gantry ready"

// run runs the group until a signal or an actor's error. It logs readyMsg,
// with the listen URLs, once every component that reports readiness is
// ready. A signal is a clean stop.
func (p *process) run() error {
	done := make(chan struct{})
	p.g.Add(func() error {
		for _, c := range p.ready {
			select {
			case <-c:
			case <-done:
				return nil
			}
		}
		p.log.Info(readyMsg, p.attrs...)
		<-done
		return nil
	}, func(error) { close(done) })
	err := p.g.Run()
	p.drainConns()
	// A signal, or the end of the context (the Windows service stopping),
	// is a clean stop.
	if errors.Is(err, run.ErrSignal) || errors.Is(err, context.Canceled) {
		p.log.Info("stopped", "reason", err.Error())
		return nil
	}
	return err
}

// drainConns drains every component connection and waits, briefly, for the
// drains to finish, so nothing is in flight when the broker stops.
func (p *process) drainConns() {
	for _, nc := range p.conns {
		_ = nc.Drain()
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, nc := range p.conns {
		for !nc.IsClosed() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		nc.Close()
	}
}

// abort releases what a process that will not run has opened: its HTTP
// listener and its connections.
func (p *process) abort() {
	if p.http != nil {
		_ = p.http.ln.Close()
	}
	p.drainConns()
}
