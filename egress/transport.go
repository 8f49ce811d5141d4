package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// ProxyError is a proxy's refusal: a CONNECT answered with a status other
// than 200, a plain http request the proxy answered itself with an error
// (see Transport), or a failed SOCKS5 handshake.
type ProxyError struct {
	// Proxy is the proxy's address (host:port).
	Proxy string
	// Target is the address the request was for.
	Target string
	// Status is the proxy's answer's status code; zero for SOCKS5.
	Status int
	Err    error
}

// Error says which proxy refused which target, and how.
func (e *ProxyError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("proxy %s refused %s: %d %s", e.Proxy, e.Target, e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("proxy %s refused %s: %v", e.Proxy, e.Target, e.Err)
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

// Transport is an HTTP transport whose every connection goes out through
// one route's proxy, by net/http's own proxy support: an http:// proxy
// tunnels https targets with CONNECT and forwards plain http requests, a
// socks5:// proxy tunnels both (the proxy resolves host names). Credentials
// in the proxy URL are sent to the proxy. Its errors carry what
// ClassifyError needs: a proxy's refusal is a *ProxyError.
//
// A forwarded plain http request gets the proxy's own error answer as its
// response, which can look like the target's: Transport takes a 407 (only
// a proxy asks for proxy credentials) or an answer with a Proxy-Status
// header naming an error (RFC 9209) for the proxy's refusal. The embedded
// http.Transport may be tuned (keep-alives, TLS) before first use.
type Transport struct {
	*http.Transport
	// proxy is the route's proxy; nil for a direct route.
	proxy *url.URL
}

// NewTransport returns a transport whose every connection goes out
// through proxyURL: "direct" (or empty), http://host:port or
// socks5://host:port. base makes the first hop; nil means a net.Dialer
// with a 30 s connect timeout. It ignores the environment's proxy
// settings.
func NewTransport(proxyURL string, base *net.Dialer) (*Transport, error) {
	u, err := parseProxy(proxyURL)
	if err != nil {
		return nil, err
	}
	if base == nil {
		base = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	}
	tr := &http.Transport{
		DialContext:           base.DialContext,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   10,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		OnProxyConnectResponse: func(_ context.Context, proxy *url.URL, req *http.Request, resp *http.Response) error {
			if resp.StatusCode != http.StatusOK {
				return &ProxyError{Proxy: proxy.Host, Target: req.URL.Opaque, Status: resp.StatusCode}
			}
			return nil
		},
	}
	if u != nil {
		tr.Proxy = http.ProxyURL(u)
	}
	return &Transport{Transport: tr, proxy: u}, nil
}

// RoundTrip sends req through the route's proxy.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.Transport.RoundTrip(req)
	switch {
	case t.proxy == nil:
	case err != nil && t.proxy.Scheme == "socks5":
		return nil, socksError(t.proxy.Host, targetAddr(req.URL), err)
	case err == nil && req.URL.Scheme == "http" && t.proxy.Scheme == "http" && refusedByProxy(resp):
		_ = resp.Body.Close()
		return nil, &ProxyError{Proxy: t.proxy.Host, Target: targetAddr(req.URL), Status: resp.StatusCode}
	}
	return resp, err
}

// refusedByProxy reports whether the answer to a forwarded request is the
// proxy's own refusal: a 407, or a Proxy-Status entry with an error
// parameter (RFC 9209).
func refusedByProxy(resp *http.Response) bool {
	if resp.StatusCode == http.StatusProxyAuthRequired {
		return true
	}
	for _, v := range resp.Header.Values("Proxy-Status") {
		for _, param := range strings.Split(v, ";") {
			if k, _, _ := strings.Cut(strings.TrimSpace(param), "="); strings.EqualFold(k, "error") {
				return true
			}
		}
	}
	return false
}

// socksError marks a failed SOCKS5 handshake as a ProxyError and keeps
// any other failure (the proxy refused the connection, a timeout, the
// target's answer) as it is.
func socksError(proxyAddr, target string, err error) error {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "socks connect" || isTimeout(err) || isRefused(err) {
		return err
	}
	return &ProxyError{Proxy: proxyAddr, Target: target, Err: op.Err}
}

// targetAddr is u's host:port, with the scheme's default port.
func targetAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
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
