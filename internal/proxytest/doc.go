// Package proxytest starts real proxies on loopback for tests: an HTTP
// proxy (CONNECT tunnels and plain forwarding) and a SOCKS5 proxy, each
// counting the tunnels it opens and
// able to add latency, hang, or refuse, plus helpers for a closed port and
// a server that reports the caller's exit IP and region.
package proxytest
