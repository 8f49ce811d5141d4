package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/gantry-dev/gantry/client"
)

// clientFlags are the connection flags, named as the nats CLI names them.
type clientFlags struct {
	// fs holds the flags, to tell the ones given from the defaults.
	fs       *pflag.FlagSet
	context  string
	server   string
	creds    string
	nkey     string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	token    string
	timeout  time.Duration
}

func (c *clientFlags) register(fs *pflag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.context, "context", os.Getenv("NATS_CONTEXT"), "nats CLI context to connect with (env NATS_CONTEXT; default the one 'nats context select' chose); the flags below win over it")
	fs.StringVarP(&c.server, "server", "s", cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), "NATS server URL(s), comma separated (env NATS_URL)")
	fs.StringVar(&c.creds, "creds", "", "user credentials file")
	fs.StringVar(&c.nkey, "nkey", "", "user NKey seed file")
	fs.StringVar(&c.user, "user", "", "user name or token")
	fs.StringVar(&c.password, "password", "", "password")
	fs.StringVar(&c.tlsCA, "tlsca", "", "CA certificate to verify the server with")
	fs.StringVar(&c.tlsCert, "tlscert", "", "client TLS certificate")
	fs.StringVar(&c.tlsKey, "tlskey", "", "client TLS private key")
	fs.DurationVar(&c.timeout, "timeout", client.DefaultTimeout, "how long a client request may take")
}

// applyContext fills the connection flags not given (on the command line,
// or NATS_URL for --server) from the nats CLI context named by --context,
// or else the one the nats CLI has selected, as the nats CLI does.
func (c *clientFlags) applyContext() error {
	name := c.context
	if name == "" {
		sel, err := client.SelectedContext()
		if err != nil || sel == "" {
			return err
		}
		name = sel
	}
	ctx, err := client.LoadContext(name)
	if err != nil {
		return fmt.Errorf("--context: %w", err)
	}
	for _, f := range []struct {
		flag string
		dst  *string
		v    string
	}{
		{"server", &c.server, ctx.Servers}, {"creds", &c.creds, ctx.Creds}, {"user", &c.user, ctx.User},
		{"password", &c.password, ctx.Password}, {"tlsca", &c.tlsCA, ctx.TLSCA}, {"tlscert", &c.tlsCert, ctx.TLSCert},
		{"tlskey", &c.tlsKey, ctx.TLSKey},
	} {
		given := c.fs.Changed(f.flag) || f.flag == "server" && os.Getenv("NATS_URL") != ""
		if f.v != "" && !given {
			*f.dst = f.v
		}
	}
	c.token = ctx.Token
	return nil
}

// options returns the client options the flags ask for, for a connection
// named name.
func (c *clientFlags) options(name string) client.Options {
	return client.Options{
		Servers: c.server, Creds: c.creds, NKey: c.nkey, User: c.user, Password: c.password,
		TLSCA: c.tlsCA, TLSCert: c.tlsCert, TLSKey: c.tlsKey, Token: c.token, Name: name, Timeout: c.timeout,
	}
}

// connect opens the connection of a component process to the server the
// flags name.
func (c *clientFlags) connect(name string, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(c.server, append(c.options(name).NATSOptions(), extra...)...)
	if err != nil {
		return nil, nil, connectHint(fmt.Errorf("connect to %s: %w", c.server, err))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// authenticated reports whether the flags carry credentials.
func (c *clientFlags) authenticated() bool {
	return c.creds != "" || c.nkey != "" || c.user != "" || c.tlsCert != ""
}

// permissionError is the broker refusing a publish or subscription the
// user's permissions do not allow.
type permissionError struct{ err error }

func (e *permissionError) Error() string {
	return fmt.Sprintf("permission denied: %s (the user's role does not allow it; see docs/deployment.md#permissions)",
		strings.TrimPrefix(e.err.Error(), nats.ErrPermissionViolation.Error()+": "))
}

func (e *permissionError) Unwrap() error { return e.err }

// connectHint says what to do about a failed connect.
func connectHint(err error) error {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return fmt.Errorf("%w (the server needs credentials: pass --user and --password, or --creds)", err)
	}
	return fmt.Errorf("%w (is gantry running? start it with 'gantry run', or point --server at it)", err)
}

// connect opens the client of a client command (submit, task, lease,
// resource, job, route, audit), named name. Its audit events name the
// component "cli"; its stores log to stderr, so that an audit event they
// could not publish is not lost silently.
func (a *app) connect(ctx context.Context, name string, opts ...client.Option) (*client.Client, error) {
	log, err := a.logger()
	if err != nil {
		return nil, err
	}
	co := a.client.options(name)
	if dl, ok := ctx.Deadline(); ok {
		co.Timeout = min(co.Timeout, max(time.Until(dl), time.Millisecond))
	}
	// A refused publish or subscription ends the command at once, naming
	// the subject, rather than when its reply times out.
	nopts := append(co.NATSOptions(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) && a.abort != nil {
			a.abort(&permissionError{err: err})
		}
	}))
	nc, err := nats.Connect(co.Servers, nopts...)
	if err != nil {
		return nil, connectHint(fmt.Errorf("connect to %s: %w", co.Servers, err))
	}
	opts = append([]client.Option{client.WithTimeout(a.client.timeout), client.WithComponent("cli"), client.WithLogger(log)}, opts...)
	c, err := client.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// closeClient closes c once the command's audit events are stored. The
// command's own outcome stands; an event that may be missing from the
// audit trail is reported on stderr.
func (a *app) closeClient(c *client.Client) {
	if err := c.Close(); err != nil {
		fmt.Fprintf(a.stderr, "gantry: %v (check 'gantry audit query')\n", err)
	}
	c.Conn().Close()
}

// withClient connects, runs fn and closes the client.
func (a *app) withClient(ctx context.Context, name string, fn func(*client.Client) error, opts ...client.Option) error {
	c, err := a.connect(ctx, name, opts...)
	if err != nil {
		return err
	}
	defer a.closeClient(c)
	return fn(c)
}
