package proxytest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Kind is the protocol a Proxy speaks.
type Kind int

// The proxy kinds.
const (
	// HTTPConnect is an HTTP proxy: it answers CONNECT requests with a
	// tunnel and forwards plain http requests (absolute form).
	HTTPConnect Kind = iota
	// SOCKS5 answers SOCKS5 CONNECT commands (RFC 1928, 1929).
	SOCKS5
)

// Proxy is a real proxy listening on 127.0.0.1, closed by t.Cleanup.
type Proxy struct {
	kind Kind
	ln   net.Listener

	delay atomic.Int64
	hang  atomic.Bool
	deny  atomic.Bool
	user  string
	pass  string

	// upstream forwards plain http requests; ctx ends them on Close.
	upstream *http.Transport
	ctx      context.Context
	cancel   context.CancelFunc

	tunnels  atomic.Int64
	requests atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	targets  map[string]int64
	done     chan struct{}
}

// Option configures a Proxy.
type Option func(*Proxy)

// WithAuth makes the proxy require user and password.
func WithAuth(user, pass string) Option {
	return func(p *Proxy) { p.user, p.pass = user, pass }
}

// Start starts a proxy of kind on 127.0.0.1:0.
func Start(t testing.TB, kind Kind, opts ...Option) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{kind: kind, ln: ln, conns: map[net.Conn]struct{}{}, targets: map[string]int64{}, done: make(chan struct{}),
		upstream: &http.Transport{DisableCompression: true}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, o := range opts {
		o(p)
	}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy URL a route names: http://host:port or
// socks5://host:port, with the credentials when it requires them.
func (p *Proxy) URL() string {
	scheme := "http"
	if p.kind == SOCKS5 {
		scheme = "socks5"
	}
	cred := ""
	if p.user != "" {
		cred = p.user + ":" + p.pass + "@"
	}
	return scheme + "://" + cred + p.Addr()
}

// SetDelay makes the proxy wait d before answering each tunnel request.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetHang makes the proxy accept connections and never answer.
func (p *Proxy) SetHang(on bool) { p.hang.Store(on) }

// SetDeny makes the proxy refuse every tunnel and forwarded request (403
// with a Proxy-Status error for HTTP, "connection not allowed by ruleset"
// for SOCKS5).
func (p *Proxy) SetDeny(on bool) { p.deny.Store(on) }

// Tunnels returns how many tunnels the proxy has opened to a target, a
// forwarded request counting as one.
func (p *Proxy) Tunnels() int64 { return p.tunnels.Load() }

// TunnelsTo returns how many tunnels the proxy has opened to addr
// (host:port as the client asked for it), a forwarded request counting as
// one.
func (p *Proxy) TunnelsTo(addr string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.targets[addr]
}

// Requests returns how many connections have reached the proxy, whether or
// not it opened a tunnel for them.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

func (p *Proxy) opened(target string) {
	p.tunnels.Add(1)
	p.mu.Lock()
	p.targets[target]++
	p.mu.Unlock()
}

// Close stops the proxy and every connection through it, and waits for its
// goroutines. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return
	default:
	}
	close(p.done)
	p.cancel()
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.upstream.CloseIdleConnections()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.requests.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			if p.hang.Load() {
				select {
				case <-p.done:
				case <-readAll(c):
				}
				return
			}
			if p.kind == SOCKS5 {
				p.socks(c)
			} else {
				p.connect(c)
			}
		}()
	}
}

// readAll returns a channel closed when c's peer closes.
func readAll(c net.Conn) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c)
		close(ch)
	}()
	return ch
}

func (p *Proxy) wait() bool {
	d := time.Duration(p.delay.Load())
	if d <= 0 {
		return true
	}
	select {
	case <-time.After(d):
		return true
	case <-p.done:
		return false
	}
}

// connect serves one client connection of an HTTP proxy: a CONNECT
// request opens a tunnel; requests in absolute form (plain http targets)
// are forwarded one by one.
func (p *Proxy) connect(c net.Conn) {
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		if req.URL.IsAbs() {
			p.forward(c, br, req)
		} else {
			refuse(c, http.StatusMethodNotAllowed, "http_request_error")
		}
		return
	}
	if !p.admit(c, req) {
		return
	}
	up, err := net.DialTimeout("tcp", req.Host, 5*time.Second)
	if err != nil {
		refuse(c, http.StatusBadGateway, "destination_unavailable")
		return
	}
	p.opened(req.Host)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		_ = up.Close()
		return
	}
	p.pipe(c, br, up)
}

// admit checks req's credentials, waits the delay and applies deny,
// answering the client itself when req goes no further.
func (p *Proxy) admit(c net.Conn, req *http.Request) bool {
	if p.user != "" {
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.pass))
		if req.Header.Get("Proxy-Authorization") != want {
			refuse(c, http.StatusProxyAuthRequired, "proxy_auth_required")
			return false
		}
	}
	if !p.wait() {
		return false
	}
	if p.deny.Load() {
		refuse(c, http.StatusForbidden, "destination_ip_prohibited")
		return false
	}
	return true
}

// refuse answers with status and a Proxy-Status header naming the error
// (RFC 9209), as proxies do for the errors they generate themselves.
func refuse(c net.Conn, status int, proxyErr string) {
	_, _ = io.WriteString(c, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+
		"\r\nProxy-Status: proxytest; error="+proxyErr+"\r\nContent-Length: 0\r\n\r\n")
}

// forward sends req, and each further request the client sends on c, to
// its target and copies the answer back, as a plain HTTP proxy does; the
// connections to the targets are kept alive and reused.
func (p *Proxy) forward(c net.Conn, br *bufio.Reader, req *http.Request) {
	for {
		if !p.admit(c, req) {
			return
		}
		target := req.URL.Host
		if req.URL.Port() == "" {
			target = net.JoinHostPort(req.URL.Hostname(), "80")
		}
		req.RequestURI = ""
		req.Header.Del("Proxy-Authorization")
		req.Header.Del("Proxy-Connection")
		resp, err := p.upstream.RoundTrip(req.WithContext(p.ctx))
		if err != nil {
			refuse(c, http.StatusBadGateway, "destination_unavailable")
			return
		}
		p.opened(target)
		err = resp.Write(c)
		_ = resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return
		}
		if req, err = http.ReadRequest(br); err != nil {
			return
		}
	}
}

func (p *Proxy) socks(c net.Conn) {
	br := bufio.NewReader(c)
	var hdr [2]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil || hdr[0] != 5 {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return
	}
	want := byte(0)
	if p.user != "" {
		want = 2
	}
	if !contains(methods, want) {
		_, _ = c.Write([]byte{5, 0xff})
		return
	}
	if _, err := c.Write([]byte{5, want}); err != nil {
		return
	}
	if want == 2 && !p.socksAuth(br, c) {
		return
	}
	var req [4]byte
	if _, err := io.ReadFull(br, req[:]); err != nil || req[1] != 1 {
		return
	}
	host, err := socksAddr(br, req[3])
	if err != nil {
		return
	}
	var port [2]byte
	if _, err := io.ReadFull(br, port[:]); err != nil {
		return
	}
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port[:]))))
	if !p.wait() {
		return
	}
	reply := func(code byte) error {
		_, err := c.Write([]byte{5, code, 0, 1, 0, 0, 0, 0, 0, 0})
		return err
	}
	if p.deny.Load() {
		_ = reply(2)
		return
	}
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		_ = reply(5)
		return
	}
	p.opened(target)
	if err := reply(0); err != nil {
		_ = up.Close()
		return
	}
	p.pipe(c, br, up)
}

func (p *Proxy) socksAuth(br *bufio.Reader, c net.Conn) bool {
	var ver [2]byte
	if _, err := io.ReadFull(br, ver[:]); err != nil {
		return false
	}
	user := make([]byte, ver[1])
	if _, err := io.ReadFull(br, user); err != nil {
		return false
	}
	n, err := br.ReadByte()
	if err != nil {
		return false
	}
	pass := make([]byte, n)
	if _, err := io.ReadFull(br, pass); err != nil {
		return false
	}
	ok := string(user) == p.user && string(pass) == p.pass
	status := byte(1)
	if ok {
		status = 0
	}
	_, _ = c.Write([]byte{1, status})
	return ok
}

func socksAddr(br *bufio.Reader, typ byte) (string, error) {
	switch typ {
	case 1, 4:
		ip := make([]byte, 4)
		if typ == 4 {
			ip = make([]byte, 16)
		}
		if _, err := io.ReadFull(br, ip); err != nil {
			return "", err
		}
		return net.IP(ip).String(), nil
	case 3:
		n, err := br.ReadByte()
		if err != nil {
			return "", err
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(br, name); err != nil {
			return "", err
		}
		return string(name), nil
	}
	return "", errors.New("unknown address type")
}

func contains(b []byte, x byte) bool {
	for _, c := range b {
		if c == x {
			return true
		}
	}
	return false
}

// pipe copies both ways between the client (whose buffered bytes are in
// br) and the upstream until either side closes.
func (p *Proxy) pipe(c net.Conn, br *bufio.Reader, up net.Conn) {
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, br)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// ClosedAddr returns a loopback host:port nothing listens on.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// ExitServer starts an HTTP server that reports, as JSON, the IP its caller
// connected from ({"ip": ..., "region": region}), like the "what is my IP"
// services routes are checked against. Closed by t.Cleanup.
func ExitServer(t testing.TB, region string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"ip": host, "region": region})
	}))
	t.Cleanup(srv.Close)
	return srv
}
