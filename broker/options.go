package broker

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// validate checks what New cannot fill in: a listener beyond loopback
// needs authentication, users need credentials and a known role, the
// cluster and leaf settings need addresses.
func (cfg *Config) validate(host string) error {
	authed := len(cfg.Users) > 0 || cfg.Operator != nil || (cfg.TLS != nil && cfg.TLS.Verify)
	if cfg.Operator != nil && len(cfg.Users) > 0 {
		return errors.New("operator mode takes its users from creds files: configure users or an operator, not both")
	}
	if !cfg.DontListen && !IsLoopback(host) && !authed {
		return fmt.Errorf("%w: %q is not a loopback address; configure users (auth.users in the config file) or listen on 127.0.0.1", ErrInsecureListen, cfg.Listen)
	}
	for i, u := range cfg.Users {
		switch {
		case u.NKey != "":
			if !nkeys.IsValidPublicUserKey(u.NKey) {
				return fmt.Errorf("user %d: nkey %q is not a user public key (U...)", i, u.NKey)
			}
		case u.Name == "" || u.Password == "":
			return fmt.Errorf("user %d: needs a name and a password, or an nkey", i)
		case u.Name == internalUserName:
			return fmt.Errorf("user name %q is reserved", internalUserName)
		}
		if u.Role != "" {
			if _, err := ParseRole(string(u.Role)); err != nil {
				return fmt.Errorf("user %d: %w", i, err)
			}
		}
	}
	for _, t := range []*TLS{cfg.TLS, clusterTLS(cfg.Cluster), leafTLS(cfg.Leaf)} {
		if t != nil && (t.Cert == "" || t.Key == "") {
			return errors.New("tls: a listener needs cert and key")
		}
	}
	if c := cfg.Cluster; c != nil {
		h, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("cluster listen address %q: %w", c.Listen, err)
		}
		if !IsLoopback(h) && c.TLS == nil {
			return fmt.Errorf("%w: cluster %q is not a loopback address; routes beyond loopback need cluster TLS (tls.cluster in the config file)", ErrInsecureListen, c.Listen)
		}
		if len(c.Routes) == 0 {
			return errors.New("a cluster needs the routes of its other members")
		}
		if _, err := routeURLs(c.Routes); err != nil {
			return err
		}
	}
	if l := cfg.Leaf; l != nil && l.Listen != "" {
		h, _, err := net.SplitHostPort(l.Listen)
		if err != nil {
			return fmt.Errorf("leaf listen address %q: %w", l.Listen, err)
		}
		if !IsLoopback(h) && len(cfg.Users) == 0 && cfg.Operator == nil && (l.TLS == nil || !l.TLS.Verify) {
			return fmt.Errorf("%w: leaf listen %q is not a loopback address; configure users (a user with role leaf) or verified TLS", ErrInsecureListen, l.Listen)
		}
	}
	if l := cfg.Leaf; l != nil {
		for _, r := range l.Remotes {
			if _, err := url.Parse(r); err != nil {
				return fmt.Errorf("leaf remote %q: %w", r, err)
			}
		}
	}
	return nil
}

func clusterTLS(c *Cluster) *TLS {
	if c == nil {
		return nil
	}
	return c.TLS
}

func leafTLS(l *Leaf) *TLS {
	if l == nil {
		return nil
	}
	return l.TLS
}

// routeURLs parses the cluster's route URLs.
func routeURLs(routes []string) ([]*url.URL, error) {
	out := make([]*url.URL, 0, len(routes))
	for _, r := range routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("cluster route %q: want nats-route://host:port", r)
		}
		out = append(out, u)
	}
	return out, nil
}

// serverOptions turns the configuration into nats-server's options.
func (b *Broker) serverOptions() (*server.Options, error) {
	cfg := b.cfg
	opts := &server.Options{
		ServerName:             cfg.ServerName,
		Host:                   b.host,
		Port:                   b.port,
		DontListen:             cfg.DontListen,
		NoSigs:                 true,
		JetStream:              true,
		JetStreamDomain:        cfg.Domain,
		StoreDir:               cfg.DataDir,
		SyncAlways:             cfg.Sync == SyncAlways,
		SyncInterval:           cfg.SyncInterval,
		MaxPayload:             cfg.MaxPayload,
		DisableJetStreamBanner: true,
	}
	if len(cfg.Users) > 0 {
		opts.Users = append(opts.Users, &server.User{Username: b.internalUser.Name, Password: b.internalUser.Password})
		for _, u := range cfg.Users {
			perms, err := serverPermissions(cmp.Or(u.Role, RoleOperator))
			if err != nil {
				return nil, err
			}
			if u.NKey != "" {
				opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.NKey, Permissions: perms})
				continue
			}
			opts.Users = append(opts.Users, &server.User{Username: u.Name, Password: u.Password, Permissions: perms})
		}
	}
	if cfg.Operator != nil {
		if err := b.operatorOptions(opts); err != nil {
			return nil, err
		}
	}
	if cfg.TLS != nil {
		tc, err := serverTLS(cfg.TLS, false)
		if err != nil {
			return nil, fmt.Errorf("client tls: %w", err)
		}
		opts.TLS, opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = true, tc, cfg.TLS.Verify, 2
	}
	if c := cfg.Cluster; c != nil {
		host, port, err := hostPort(c.Listen)
		if err != nil {
			return nil, fmt.Errorf("cluster listen: %w", err)
		}
		routes, err := routeURLs(c.Routes)
		if err != nil {
			return nil, err
		}
		opts.Cluster = server.ClusterOpts{Name: cmp.Or(c.Name, "gantry"), Host: host, Port: port}
		opts.Routes = routes
		if c.TLS != nil {
			tc, err := serverTLS(c.TLS, true)
			if err != nil {
				return nil, fmt.Errorf("cluster tls: %w", err)
			}
			opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, 2
		}
	}
	if l := cfg.Leaf; l != nil {
		if l.Listen != "" {
			host, port, err := hostPort(l.Listen)
			if err != nil {
				return nil, fmt.Errorf("leaf listen: %w", err)
			}
			opts.LeafNode.Host, opts.LeafNode.Port = host, port
			if l.TLS != nil {
				tc, err := serverTLS(l.TLS, false)
				if err != nil {
					return nil, fmt.Errorf("leaf tls: %w", err)
				}
				opts.LeafNode.TLSConfig, opts.LeafNode.TLSTimeout = tc, 2
			}
		}
		if len(l.Remotes) > 0 {
			remote, err := leafRemote(l)
			if err != nil {
				return nil, err
			}
			opts.LeafNode.Remotes = []*server.RemoteLeafOpts{remote}
		}
	}
	return opts, nil
}

// leafSeparate are the subjects that never cross a leaf link: each side's
// tasks, buckets, services and advisories are its own. Only the JetStream
// domain traffic (the hub sourcing the leaf's audit stream) crosses.
var leafSeparate = []string{"gantry.>", kvPrefix + ">", objPrefix + ">", srvAll, "$JS.EVENT.>"}

// leafRemote is the link of a leaf broker to its hub.
func leafRemote(l *Leaf) (*server.RemoteLeafOpts, error) {
	r := &server.RemoteLeafOpts{Credentials: l.Credentials, DenyImports: leafSeparate, DenyExports: leafSeparate}
	for _, s := range l.Remotes {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("leaf remote %q: want nats-leaf://host:port", s)
		}
		r.URLs = append(r.URLs, u)
	}
	if t := l.RemoteTLS; t != nil {
		tc, err := clientTLS(t)
		if err != nil {
			return nil, fmt.Errorf("leaf remote tls: %w", err)
		}
		r.TLS, r.TLSConfig, r.TLSTimeout = true, tc, 2
	}
	return r, nil
}

func hostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("address %q: bad port", addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return h, port, nil
}

// serverTLS is the TLS of a listener. A route's verifies both sides, and
// dials with the same CA.
func serverTLS(t *TLS, route bool) (*tls.Config, error) {
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.Cert, KeyFile: t.Key, CaFile: t.CA, Verify: t.Verify || route})
	if err != nil {
		return nil, err
	}
	if route {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		tc.RootCAs = tc.ClientCAs
	}
	return tc, nil
}

// clientTLS is the TLS of a dialled link: the CA that verifies the server,
// and a client certificate when one is set.
func clientTLS(t *TLS) (*tls.Config, error) {
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.Cert, KeyFile: t.Key, CaFile: t.CA})
	if err != nil {
		return nil, err
	}
	tc.RootCAs = tc.ClientCAs
	return tc, nil
}

// serverPermissions turns a role into nats-server's permissions.
func serverPermissions(r Role) (*server.Permissions, error) {
	p, err := RolePermissions(r)
	if err != nil {
		return nil, err
	}
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.PublishAllow, Deny: p.PublishDeny},
		Subscribe: &server.SubjectPermission{Allow: p.SubscribeAllow, Deny: p.SubscribeDeny},
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1}
	}
	return sp, nil
}

// ErrStandaloneData is returned by Start when a cluster member would start
// on the data dir of a standalone broker: JetStream would not carry its
// streams into the cluster, and they would be lost.
var ErrStandaloneData = errors.New("the data dir holds a standalone broker's streams, which a cluster member does not carry over")

// checkClusterable refuses a data dir that a standalone broker used: its
// streams are under jetstream/<account>/streams, and a clustered one also
// has the meta group under jetstream/$SYS/_js_/_meta_.
func checkClusterable(dataDir string) error {
	js := filepath.Join(dataDir, "jetstream")
	if _, err := os.Stat(filepath.Join(js, "$SYS", "_js_", "_meta_")); err == nil {
		return nil
	}
	streams, _ := filepath.Glob(filepath.Join(js, "*", "streams", "*"))
	if len(streams) == 0 {
		return nil
	}
	return fmt.Errorf("%w (%s): start cluster members on fresh data dirs; see 'Growing a desktop into a cluster' in docs/deployment.md", ErrStandaloneData, dataDir)
}
