package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
)

// clientFlags are the connection flags, named as the nats CLI names them.
type clientFlags struct {
	server   string
	creds    string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	timeout  time.Duration
}

func (c *clientFlags) register(fs *pflag.FlagSet) {
	fs.StringVarP(&c.server, "server", "s", cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), "NATS server URL(s), comma separated (env NATS_URL)")
	fs.StringVar(&c.creds, "creds", "", "user credentials file")
	fs.StringVar(&c.user, "user", "", "user name or token")
	fs.StringVar(&c.password, "password", "", "password")
	fs.StringVar(&c.tlsCA, "tlsca", "", "CA certificate to verify the server with")
	fs.StringVar(&c.tlsCert, "tlscert", "", "client TLS certificate")
	fs.StringVar(&c.tlsKey, "tlskey", "", "client TLS private key")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long a client request may take")
}

// options returns the nats.Options the flags ask for.
func (c *clientFlags) options(name string) []nats.Option {
	opts := []nats.Option{nats.Name(name), nats.Timeout(c.timeout)}
	if c.creds != "" {
		opts = append(opts, nats.UserCredentials(c.creds))
	}
	if c.user != "" {
		opts = append(opts, nats.UserInfo(c.user, c.password))
	}
	if c.tlsCA != "" {
		opts = append(opts, nats.RootCAs(c.tlsCA))
	}
	if c.tlsCert != "" || c.tlsKey != "" {
		opts = append(opts, nats.ClientCert(c.tlsCert, c.tlsKey))
	}
	return opts
}

// connect opens a client connection to the server the flags name.
func (c *clientFlags) connect(name string, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(c.server, append(c.options(name), extra...)...)
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return nil, nil, fmt.Errorf("connect to %s: %w (the server needs credentials: pass --user and --password, or --creds)", c.server, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w (is gantry running? start it with 'gantry run', or point --server at it)", c.server, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}
