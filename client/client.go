package client

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/jobs"
	"github.com/gantry-dev/gantry/lease"
	"github.com/gantry-dev/gantry/tasks"
)

// Defaults of Options and of the Option functions.
const (
	// DefaultTimeout bounds the connect and every call whose context has no
	// deadline (Wait, HoldLease, TailAudit and a lease waiting in line
	// excepted: they last as long as their context).
	DefaultTimeout = 10 * time.Second
	// DefaultName names the connection Connect opens.
	DefaultName = "gantry-client"
	// DefaultComponent is the component the client's audit events name.
	DefaultComponent = "client"
)

// Options are what Connect connects with, named as the nats CLI names its
// flags (--server, --creds, --nkey, --user, --password, --tlsca,
// --tlscert, --tlskey, --timeout).
type Options struct {
	// Servers is the broker's URL, or several comma separated. Defaults to
	// nats.DefaultURL (nats://127.0.0.1:4222).
	Servers string
	// Creds is a user credentials file (JWT and NKey seed).
	Creds string
	// User and Password authenticate with a user name and password.
	User, Password string
	// Token authenticates with a token.
	Token string
	// NKey is a file holding a user NKey seed (SU...) to authenticate with.
	NKey string
	// TLSCA is the CA certificate to verify the server with; TLSCert and
	// TLSKey are a client certificate and its key.
	TLSCA, TLSCert, TLSKey string
	// Name names the connection, as the server lists it. Defaults to
	// DefaultName.
	Name string
	// Timeout bounds the connect, and is the client's WithTimeout. Defaults
	// to DefaultTimeout.
	Timeout time.Duration
}

// NATSOptions returns the nats.Options that o asks for; a process that
// opens its own connection (a component) connects with them.
func (o Options) NATSOptions() []nats.Option {
	opts := []nats.Option{nats.Name(cmp.Or(o.Name, DefaultName)), nats.Timeout(cmp.Or(o.Timeout, DefaultTimeout))}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.NKey != "" {
		if opt, err := nats.NkeyOptionFromSeed(o.NKey); err == nil {
			opts = append(opts, opt)
		} else {
			opts = append(opts, func(*nats.Options) error { return fmt.Errorf("nkey %s: %w", o.NKey, err) })
		}
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	return opts
}

// Option tunes a Client.
type Option func(*settings)

type settings struct {
	timeout   time.Duration
	log       *slog.Logger
	component string
	retention time.Duration
}

// WithTimeout bounds every call whose context has no deadline (Wait,
// HoldLease, TailAudit and WaitInLine excepted). Defaults to DefaultTimeout.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithLogger sets the logger of the client's stores: they log what they
// cannot return, such as an audit event they could not publish. Defaults
// to discarding.
func WithLogger(l *slog.Logger) Option { return func(s *settings) { s.log = l } }

// WithComponent sets the component the client's audit events name.
// Defaults to DefaultComponent.
func WithComponent(name string) Option { return func(s *settings) { s.component = name } }

// WithTaskRetention sets how long the record of a task this client
// cancels out of the stream is kept (as the workers' task retention).
// Defaults to tasks.DefaultRetention; tasks.KeepForever keeps it.
func WithTaskRetention(d time.Duration) Option { return func(s *settings) { s.retention = d } }

// Client is gantry's front door for Go programs: it submits tasks and
// waits for them, and reads and changes tasks, leases, resources, jobs,
// routes and the audit trail, from any machine that reaches the broker.
// It builds on the domain packages (tasks, lease, jobs, egress) and calls
// the components' services; it is safe for concurrent use.
type Client struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	own bool
	set settings
	em  *audit.Emitter

	tasks       lazy[*tasks.Store]
	checkpoints lazy[*tasks.CheckpointStore]
	resources   lazy[*lease.Resources]
	jobs        lazy[*jobs.Store]
	scheduler   lazy[*jobs.SchedulerStore]
	routes      lazy[*egress.Store]
	queues      lazy[*tasks.Queues]
	presence    lazy[*tasks.Presence]
}

// Connect connects to the broker with opts and returns a client that owns
// the connection: Close closes it. opts.Timeout is also the client's
// WithTimeout; more tune the client further. A deadline on ctx bounds the
// connect.
func Connect(ctx context.Context, opts Options, more ...Option) (*Client, error) {
	servers := cmp.Or(opts.Servers, nats.DefaultURL)
	timeout := cmp.Or(opts.Timeout, DefaultTimeout)
	if dl, ok := ctx.Deadline(); ok {
		opts.Timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", servers, err)
	}
	nc, err := nats.Connect(servers, opts.NATSOptions()...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", servers, err)
	}
	c, err := New(nc, append([]Option{WithTimeout(timeout)}, more...)...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.own = true
	return c, nil
}

// New returns a client on nc, an open connection it does not own: Close
// leaves it open.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, fmt.Errorf("client: %w: no NATS connection", ErrInvalid)
	}
	var s settings
	for _, o := range opts {
		o(&s)
	}
	s.timeout = cmp.Or(s.timeout, DefaultTimeout)
	s.log = cmp.Or(s.log, slog.New(slog.DiscardHandler))
	s.component = cmp.Or(s.component, DefaultComponent)
	if err := tasks.CheckRetention(s.retention); err != nil {
		return nil, fmt.Errorf("client: %w: %v", ErrInvalid, err)
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(s.timeout))
	if err != nil {
		return nil, fmt.Errorf("client: jetstream: %w", err)
	}
	return &Client{nc: nc, js: js, set: s, em: audit.NewEmitter(js, s.component, nil)}, nil
}

// Conn returns the client's connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Close waits (up to the client's timeout) until the audit events of the
// lease and resource calls are stored, then closes the connection if the
// client opened it. Its error says that some of those events may be
// missing from the audit trail; what the calls did stands.
func (c *Client) Close() error {
	var err error
	if r, ok := c.resources.peek(); ok {
		ctx, cancel := context.WithTimeout(context.Background(), c.set.timeout)
		defer cancel()
		if ferr := r.Flush(ctx); ferr != nil {
			err = fmt.Errorf("audit events not confirmed stored: %w", ferr)
		}
	}
	if c.own {
		c.nc.Close()
	}
	return err
}

// bound gives ctx the client's timeout unless it has a deadline.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.set.timeout)
}

func (c *Client) taskStore(ctx context.Context) (*tasks.Store, error) {
	return c.tasks.get(func() (*tasks.Store, error) {
		return tasks.NewStore(ctx, c.js, tasks.StoreConfig{Retention: c.set.retention})
	})
}

func (c *Client) checkpointStore(ctx context.Context) (*tasks.CheckpointStore, error) {
	return c.checkpoints.get(func() (*tasks.CheckpointStore, error) { return tasks.NewCheckpointStore(ctx, c.js) })
}

func (c *Client) resourceStore() (*lease.Resources, error) {
	return c.resources.get(func() (*lease.Resources, error) {
		return lease.NewResources(c.js, lease.ResourcesConfig{Audit: c.em, Logger: c.set.log})
	})
}

func (c *Client) jobStore(ctx context.Context) (*jobs.Store, error) {
	return c.jobs.get(func() (*jobs.Store, error) { return jobs.NewStore(ctx, c.js) })
}

func (c *Client) schedulerStore(ctx context.Context) (*jobs.SchedulerStore, error) {
	return c.scheduler.get(func() (*jobs.SchedulerStore, error) { return jobs.NewSchedulerStore(ctx, c.js) })
}

func (c *Client) routeStore(ctx context.Context) (*egress.Store, error) {
	return c.routes.get(func() (*egress.Store, error) { return egress.NewStore(ctx, c.js) })
}

// lazy is a store opened on first use and kept.
type lazy[T any] struct {
	mu sync.Mutex
	v  T
	ok bool
}

func (l *lazy[T]) get(open func() (T, error)) (T, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ok {
		v, err := open()
		if err != nil {
			return v, err
		}
		l.v, l.ok = v, true
	}
	return l.v, nil
}

func (l *lazy[T]) peek() (T, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v, l.ok
}
