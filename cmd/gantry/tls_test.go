package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker"
	"github.com/gantry-dev/gantry/internal/brokertest"
)

// testCerts writes a CA, a certificate for 127.0.0.1 and localhost (for
// servers and routes: both server and client use) and a client
// certificate, all signed by the CA, into dir.
func testCerts(t *testing.T, dir string) (ca, cert, key, clientCert, clientKey string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gantry test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(serial int64, cn string, usage []x509.ExtKeyUsage) ([]byte, []byte) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der, kder
	}
	ca = write("ca.pem", "CERTIFICATE", caDER)
	sder, skey := leaf(2, "gantry server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
	cder, ckey := leaf(3, "gantry client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	return ca, write("server.pem", "CERTIFICATE", sder), write("server-key.pem", "EC PRIVATE KEY", skey),
		write("client.pem", "CERTIFICATE", cder), write("client-key.pem", "EC PRIVATE KEY", ckey)
}

// TestTLS runs a cluster of three whose client, route and HTTP listeners
// all require TLS with test-made certificates (clients must present one):
// the cluster forms over TLS, a client with the CA and its certificate
// works, and plain text is refused on the client and route ports.
func TestTLS(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a three-broker cluster takes a few seconds to form")
	}
	dir := t.TempDir()
	ca, cert, key, ccert, ckey := testCerts(t, dir)
	cfg := filepath.Join(dir, "gantry.yaml")
	tlsDoc := fmt.Sprintf("{cert: %q, key: %q, ca: %q}", cert, key, ca)
	doc := fmt.Sprintf("tls:\n  client: {cert: %q, key: %q, ca: %q, verify: true}\n  cluster: %s\n  http: %s\n", cert, key, ca, tlsDoc, tlsDoc)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	ports := brokertest.FreePorts(t, 9)
	var routes []string
	for i := range 3 {
		routes = append(routes, "nats-route://"+addr(ports[3+i]))
	}
	var procs []*proc
	for i := range 3 {
		procs = append(procs, spawn(t, fmt.Sprintf("t%d", i), "broker", "--config", cfg, "--name", fmt.Sprintf("t%d", i),
			"--data", t.TempDir(), "--nats-listen", addr(ports[i]), "--http-listen", addr(ports[6+i]),
			"--cluster", addr(ports[3+i]), "--routes", strings.Join(routes, ",")))
	}
	for _, p := range procs {
		p.waitReady(t, 60*time.Second)
	}
	url := "nats://" + addr(ports[0])

	// Plain text is refused: the client port requires TLS, a plain client
	// cannot connect, and a broker without TLS cannot join the cluster.
	if info := serverInfo(t, addr(ports[0])); !strings.Contains(info, `"tls_required":true`) {
		t.Errorf("INFO on %s = %s, want tls_required", addr(ports[0]), info)
	}
	plain, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: "plain",
		Cluster: &broker.Cluster{Listen: "127.0.0.1:0", Routes: routes}, Logger: brokertest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer pcancel()
	if err := plain.Start(pctx); err == nil {
		t.Error("a broker without cluster TLS joined the TLS cluster, want refused")
	}
	plain.Shutdown()
	if nc, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("plain-text connect succeeded, want refused")
	}
	if nc, err := nats.Connect(url, nats.RootCAs(ca), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("connect without a client certificate succeeded, want refused")
	}

	// With the CA and a client certificate, the CLI works, through any
	// member: the streams are replicated over the TLS routes.
	tlsArgs := []string{"--tlsca", ca, "--tlscert", ccert, "--tlskey", ckey}
	code, stdout, stderr := runInProcess(t, append([]string{"--server", url, "submit", "noop"}, tlsArgs...)...)
	if code != exitOK {
		t.Fatalf("submit over TLS = exit %d, stderr %q", code, stderr)
	}
	id := strings.TrimSpace(stdout)
	code, stdout, stderr = runInProcess(t, append([]string{"--server", "nats://" + addr(ports[2]), "task", "get", id, "--json"}, tlsArgs...)...)
	if code != exitOK || !strings.Contains(stdout, id) {
		t.Errorf("task get through another member = exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// HTTP serves TLS.
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(ca)
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + addr(ports[6]) + "/readyz")
	if err != nil {
		t.Fatalf("readyz over https: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("readyz over https = %d, want 200", resp.StatusCode)
	}
}

// serverInfo reads the INFO line a NATS port sends first.
func serverInfo(t *testing.T, hostPort string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostPort, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read INFO from %s: %v", hostPort, err)
	}
	return line
}
