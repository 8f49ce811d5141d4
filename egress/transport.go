package egress

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"golang.org/x/net/proxy"

	"github.com/gantry-dev/gantry/broker/wire"
)

// DialFunc opens a connection to addr, the way net.Dialer.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ProxyError is a proxy's refusal to open a tunnel: a CONNECT answered with
// a status other than 200, or a failed SOCKS5 handshake.
type ProxyError struct {
	// Proxy is the proxy's address (host:port).
	Proxy string
	// Target is the address the tunnel was asked for.
	Target string
	// Status is the CONNECT answer's status code; zero for SOCKS5.
	Status int
	Err    error
}

// Error says which proxy refused which tunnel, and how.
func (e *ProxyError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("proxy %s refused tunnel to %s: %d %s", e.Proxy, e.Target, e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("proxy %s refused tunnel to %s: %v", e.Proxy, e.Target, e.Err)
}

// Unwrap returns the SOCKS5 handshake's error, if any.
func (e *ProxyError) Unwrap() error { return e.Err }

// ProxyAddr returns the address a route's first hop connects to: the
// proxy's host:port, or "" for a direct route. It fails on a proxy value
// that is neither "direct" nor an http:// or socks5:// URL.
func ProxyAddr(proxyURL string) (string, error) {
	u, err := parseProxy(proxyURL)
	if err != nil || u == nil {
		return "", err
	}
	return u.Host, nil
}

func parseProxy(p string) (*url.URL, error) {
	if p == "" || p == wire.RouteDirect {
		return nil, nil
	}
	u, err := url.Parse(p)
	if err != nil {
		return nil, fmt.Errorf("proxy %s: not a URL", wire.RedactProxy(p))
	}
	if (u.Scheme != "http" && u.Scheme != "socks5") || u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("proxy %s: want http://host:port, socks5://host:port or direct", wire.RedactProxy(p))
	}
	return u, nil
}

// Dialer returns a dialer whose connections go out through proxyURL:
// "direct" (or empty) dials the target itself, http:// opens an HTTP
// CONNECT tunnel for every connection (plain http targets too), socks5://
// a SOCKS5 one (the proxy resolves host names). Credentials in the URL are
// sent to the proxy. base makes the first hop; nil means a default
// net.Dialer.
func Dialer(proxyURL string, base *net.Dialer) (DialFunc, error) {
	if base == nil {
		base = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	}
	u, err := parseProxy(proxyURL)
	if err != nil {
		return nil, err
	}
	switch {
	case u == nil:
		return base.DialContext, nil
	case u.Scheme == "http":
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialConnect(ctx, base, u, addr)
		}, nil
	default:
		var auth *proxy.Auth
		if u.User != nil {
			pw, _ := u.User.Password()
			auth = &proxy.Auth{User: u.User.Username(), Password: pw}
		}
		d, err := proxy.SOCKS5("tcp", u.Host, auth, base)
		if err != nil {
			return nil, fmt.Errorf("socks5 proxy %s: %w", wire.RedactProxy(proxyURL), err)
		}
		cd, ok := d.(proxy.ContextDialer)
		if !ok {
			return nil, fmt.Errorf("socks5 proxy %s: dialer without context support", wire.RedactProxy(proxyURL))
		}
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := cd.DialContext(ctx, network, addr)
			if err != nil {
				return nil, socksError(u.Host, addr, err)
			}
			return c, nil
		}, nil
	}
}

// socksError keeps a failure to reach the SOCKS5 proxy as it is (refused,
// timeout) and marks a failed handshake as a ProxyError.
func socksError(proxyAddr, target string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" && op.Addr != nil && op.Addr.String() == proxyAddr {
		return err
	}
	if isTimeout(err) || isRefused(err) {
		return err
	}
	return &ProxyError{Proxy: proxyAddr, Target: target, Err: err}
}

// dialConnect opens a CONNECT tunnel to addr through the HTTP proxy u.
func dialConnect(ctx context.Context, base *net.Dialer, u *url.URL, addr string) (net.Conn, error) {
	conn, err := base.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: addr},
		Host:   addr,
		Header: http.Header{},
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + pw))
		req.Header.Set("Proxy-Authorization", "Basic "+cred)
	}
	fail := func(err error) (net.Conn, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect tunnel via %s: %w", u.Host, ctx.Err())
		}
		return nil, err
	}
	if err := req.Write(conn); err != nil {
		return fail(fmt.Errorf("connect tunnel via %s: %w", u.Host, err))
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("connect tunnel via %s: %w", u.Host, err))
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail(&ProxyError{Proxy: u.Host, Target: addr, Status: resp.StatusCode})
	}
	if !stop() {
		return fail(fmt.Errorf("connect tunnel via %s: %w", u.Host, context.Cause(ctx)))
	}
	_ = conn.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// bufferedConn is a tunnel whose first bytes were read with the proxy's
// answer.
type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// NewTransport returns an HTTP transport whose every connection goes
// out through proxyURL (see Dialer). It ignores the environment's
// proxy settings.
func NewTransport(proxyURL string, base *net.Dialer) (*http.Transport, error) {
	dial, err := Dialer(proxyURL, base)
	if err != nil {
		return nil, err
	}
	return &http.Transport{
		DialContext:           dial,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   10,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}, nil
}

// ClassifyError says why a connection or request through a route failed:
// refused (or reset), timeout, proxy (the proxy refused the tunnel) or
// other.
func ClassifyError(err error) wire.ErrorKind {
	var pe *ProxyError
	switch {
	case err == nil:
		return ""
	case isTimeout(err):
		return wire.KindTimeout
	case errors.As(err, &pe):
		return wire.KindProxy
	case isRefused(err):
		return wire.KindRefused
	}
	return wire.KindOther
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isRefused(err error) bool {
	for _, e := range refusedErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
