package config

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Route defaults and limits.
const (
	// DefaultRouteInterval is a route's probe interval when the config
	// gives none.
	DefaultRouteInterval = 30 * time.Second
	// MinRouteInterval is the shortest probe interval accepted.
	MinRouteInterval = time.Second
)

// routeID is what a route id may hold: it is a KV key and a subject token.
var routeID = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// validate checks route i: its id, proxy, probe URL, interval and the
// exit check.
func (r Route) validate(i int) error {
	if !routeID.MatchString(r.ID) || r.ID == wire.RouteAuto {
		return fmt.Errorf("routes[%d]: id %q must be letters, digits, '-' or '_' (and not %q)", i, r.ID, wire.RouteAuto)
	}
	if err := validProxy(r.Proxy); err != nil {
		return fmt.Errorf("routes[%d] (%s): %w", i, r.ID, err)
	}
	if err := validHTTPURL(r.ProbeURL); err != nil {
		return fmt.Errorf("routes[%d] (%s): probe_url: %w", i, r.ID, err)
	}
	if r.Interval != 0 && r.Interval.Std() < MinRouteInterval {
		return fmt.Errorf("routes[%d] (%s): interval %v is shorter than %v", i, r.ID, r.Interval.Std(), MinRouteInterval)
	}
	if r.ExpectIP != "" && net.ParseIP(r.ExpectIP) == nil {
		return fmt.Errorf("routes[%d] (%s): expect_ip %q is not an IP address", i, r.ID, r.ExpectIP)
	}
	if (r.ExpectIP != "" || r.ExpectRegion != "") && r.ExpectURL == "" {
		return fmt.Errorf("routes[%d] (%s): expect_ip and expect_region need expect_url, the URL that reports the exit IP and region", i, r.ID)
	}
	if r.ExpectURL != "" {
		if err := validHTTPURL(r.ExpectURL); err != nil {
			return fmt.Errorf("routes[%d] (%s): expect_url: %w", i, r.ID, err)
		}
	}
	return nil
}

// ProxyOrDirect returns the route's proxy, "direct" when none is set.
func (r Route) ProxyOrDirect() string {
	if r.Proxy == "" {
		return wire.RouteDirect
	}
	return r.Proxy
}

func validProxy(p string) error {
	if p == "" || p == wire.RouteDirect {
		return nil
	}
	u, err := url.Parse(p)
	if err != nil {
		return fmt.Errorf("proxy %s is not a URL", wire.RedactProxy(p))
	}
	if u.Scheme != "http" && u.Scheme != "socks5" {
		return fmt.Errorf("proxy %s: want an http:// or socks5:// URL, or direct", wire.RedactProxy(p))
	}
	if u.Hostname() == "" || u.Port() == "" {
		return fmt.Errorf("proxy %s: want host:port", wire.RedactProxy(p))
	}
	return nil
}

func validHTTPURL(s string) error {
	if s == "" {
		return fmt.Errorf("required (an http:// or https:// URL)")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http:// or https:// URL", s)
	}
	return nil
}
