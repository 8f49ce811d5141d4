package alertd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/audit"
	"github.com/gantry-dev/gantry/internal/brokertest"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/config"
	"github.com/gantry-dev/gantry/internal/leaktest"
	"github.com/gantry-dev/gantry/tasks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// mail is one message the test SMTP server accepted.
type mail struct {
	from, auth string
	to         []string
	tls        bool
	data       string
}

// smtpServer is a real SMTP server on loopback (go-smtp) that offers
// STARTTLS with a certificate of its own CA and AUTH PLAIN for one user.
type smtpServer struct {
	srv    *smtp.Server
	addr   *net.TCPAddr
	caFile string

	mu    sync.Mutex
	mails []mail
}

func startSMTP(t *testing.T, user, pass string) *smtpServer {
	t.Helper()
	cert, caPEM := selfSigned(t)
	s := &smtpServer{caFile: filepath.Join(t.TempDir(), "ca.pem")}
	if err := os.WriteFile(s.caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &smtpSession{s: s, c: c, user: user, pass: pass}, nil
	}))
	s.srv.Domain = "localhost"
	s.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().(*net.TCPAddr)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.srv.Serve(ln) }()
	t.Cleanup(func() { _ = s.srv.Close(); <-done })
	return s
}

func (s *smtpServer) received() []mail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]mail(nil), s.mails...)
}

type smtpSession struct {
	s          *smtpServer
	c          *smtp.Conn
	user, pass string
	authed     string
	m          mail
}

func (ss *smtpSession) AuthMechanisms() []string { return []string{sasl.Plain} }

func (ss *smtpSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != ss.user || pass != ss.pass {
			return errors.New("bad credentials")
		}
		ss.authed = user
		return nil
	}), nil
}

func (ss *smtpSession) Mail(from string, _ *smtp.MailOptions) error {
	if ss.authed == "" {
		return errors.New("authenticate first")
	}
	_, isTLS := ss.c.TLSConnectionState()
	ss.m = mail{from: from, auth: ss.authed, tls: isTLS}
	return nil
}

func (ss *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.m.to = append(ss.m.to, to)
	return nil
}

func (ss *smtpSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	ss.m.data = string(b)
	ss.s.mu.Lock()
	ss.s.mails = append(ss.s.mails, ss.m)
	ss.s.mu.Unlock()
	return nil
}

func (ss *smtpSession) Reset()        {}
func (ss *smtpSession) Logout() error { return nil }

// selfSigned returns a certificate for 127.0.0.1 and localhost, and itself
// as a CA in PEM.
func selfSigned(t *testing.T) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gantry test smtp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// hook is a webhook receiver on loopback: it answers each call with the
// next of fail's codes, then 200, and keeps the calls.
type hook struct {
	srv *httptest.Server

	mu    sync.Mutex
	fail  []int
	calls []hookCall
}

type hookCall struct {
	event            wire.Event
	alert            wire.Alert
	signed, delivery string
	validSig         bool
}

func startHook(t *testing.T, secret string, fail ...int) *hook {
	t.Helper()
	h := &hook{fail: fail}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var c hookCall
		_ = json.Unmarshal(body, &c.event)
		_ = json.Unmarshal(c.event.Payload, &c.alert)
		c.signed, c.delivery = r.Header.Get(SignatureHeader), r.Header.Get(DeliveryHeader)
		c.validSig = c.signed == Sign([]byte(secret), body)
		h.mu.Lock()
		h.calls = append(h.calls, c)
		code := http.StatusOK
		if len(h.fail) > 0 {
			code, h.fail = h.fail[0], h.fail[1:]
		}
		h.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) received() []hookCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookCall(nil), h.calls...)
}

// setup starts a broker and alertd with cfg (its logger and metrics
// filled in), and returns the broker.
func setup(t *testing.T, cfg Config) (*brokertest.Env, *Alertd, *prometheus.Registry) {
	t.Helper()
	env := brokertest.Start(t)
	reg := prometheus.NewRegistry()
	cfg.Logger, cfg.Metrics = env.Log, reg
	a, err := New(cfg, env.NC)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		a.Stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		cancel()
	})
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before ready", err)
	case <-time.After(10 * time.Second):
		t.Fatal("alertd not ready within 10s")
	}
	return env, a, reg
}

// sum adds up every series of the metric name in reg.
func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

func ordered(subject string) jetstream.OrderedConsumerConfig {
	return jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}}
}

func needsReview(t *testing.T, env *brokertest.Env, id, typ, lastErr string) {
	t.Helper()
	em := audit.NewEmitter(env.JS, "workers", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := em.Emit(ctx, wire.Event{Type: wire.EventNeedsReview, Level: wire.LevelWarn, TaskID: id, Message: lastErr,
		Payload: audit.Payload(map[string]any{"attempts": 1, "queue": "default", "type": typ})}); err != nil {
		t.Fatal(err)
	}
}

func TestNeedsReviewAndLongRunningOneMailAndOneCallPerWindow(t *testing.T) {
	t.Parallel()
	smtpd := startSMTP(t, "ops", "s3cret")
	h := startHook(t, "hook-secret")
	alerts := config.Alerts{
		CheckInterval: config.Duration(50 * time.Millisecond),
		Rules: []config.AlertRule{
			{Name: "review", Kind: config.AlertNeedsReview, Types: []string{"exec"}, Window: config.Duration(time.Hour)},
			{Name: "slow", Kind: config.AlertLongRunning, After: config.Duration(time.Second), Window: config.Duration(time.Hour)},
		},
		Webhooks: []config.Webhook{{Name: "ops-hook", URL: h.srv.URL, Secret: "hook-secret"}},
		Email: []config.Email{{Name: "ops-mail", Host: "127.0.0.1", Port: smtpd.addr.Port, Username: "ops", Password: "s3cret",
			From: "gantry@plant.example", To: []string{"ops@plant.example"}, CAFile: smtpd.caFile}},
	}
	env, _, reg := setup(t, Config{Alerts: alerts})

	// Two exec tasks and one of another type go to NEEDS_REVIEW in one
	// window: one alert, for the first; the second is held and counted.
	needsReview(t, env, "task-1", "exec", "exec false: exit code 2")
	needsReview(t, env, "task-2", "exec", "exec false: exit code 3")
	needsReview(t, env, "task-3", "noop", "not an exec task")
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := sum(t, reg, "gantry_alertd_alerts_held_total"); got != 1 {
			return fmt.Errorf("alerts held = %v, want 1", got)
		}
		return nil
	})

	// A task that has run for 5 s, on a live worker.
	presence, err := tasks.NewPresence(context.Background(), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now().Add(-5 * time.Second).UTC()
	if err := presence.Put(context.Background(), wire.WorkerInfo{Name: "w1", Host: "plant-pc", PID: 1, Queues: []string{"default"}, Running: 1,
		Tasks:     []wire.RunningTask{{ID: "task-slow", Queue: "default", Type: "exec", Attempt: 1, StartedAt: started}},
		Heartbeat: time.Now().UTC()}, time.Minute); err != nil {
		t.Fatal(err)
	}

	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if m, c := len(smtpd.received()), len(h.received()); m != 2 || c != 2 {
			return fmt.Errorf("mails = %d, webhook calls = %d, want 2 and 2 (one per rule)", m, c)
		}
		return nil
	})
	// Several checks later, the slow task still runs: no second alert.
	checks := sum(t, reg, "gantry_alertd_alerts_total")
	check.For(t, 5*time.Second, 50*time.Millisecond, func() error {
		if n := len(smtpd.received()); n != 2 {
			return fmt.Errorf("mails = %d, want still 2", n)
		}
		if n := len(h.received()); n != 2 {
			return fmt.Errorf("webhook calls = %d, want still 2", n)
		}
		if got := sum(t, reg, "gantry_alertd_alerts_total"); got != checks {
			return fmt.Errorf("alerts = %v, want still %v", got, checks)
		}
		return nil
	})

	byRule := map[string]hookCall{}
	for _, c := range h.received() {
		if !c.validSig {
			t.Errorf("webhook %s: %s = %q, not the body's HMAC", c.alert.Rule, SignatureHeader, c.signed)
		}
		if c.delivery != c.event.ID || c.event.ID == "" {
			t.Errorf("webhook %s: %s = %q, want the event id %q", c.alert.Rule, DeliveryHeader, c.delivery, c.event.ID)
		}
		byRule[c.alert.Rule] = c
	}
	if c := byRule["review"]; c.event.Type != wire.EventAlertNeedsReview || c.alert.TaskID != "task-1" || c.alert.Type != "exec" {
		t.Errorf("review webhook = %+v, want ALERT_NEEDS_REVIEW for exec task-1", c)
	}
	if c := byRule["slow"]; c.event.Type != wire.EventAlertLongRunning || c.alert.TaskID != "task-slow" {
		t.Errorf("slow webhook = %+v, want ALERT_LONG_RUNNING for task-slow", c)
	}
	for _, m := range smtpd.received() {
		if !m.tls || m.auth != "ops" || m.from != "gantry@plant.example" || len(m.to) != 1 {
			t.Errorf("mail tls %v, auth %q, from %q, to %v; want STARTTLS, ops, gantry@plant.example, one recipient", m.tls, m.auth, m.from, m.to)
		}
		switch {
		case strings.Contains(m.data, "task-1"):
			for _, want := range []string{"Subject: [gantry] exec task task-1 needs review", "exec false: exit code 2", "gantry task get task-1"} {
				if !strings.Contains(m.data, want) {
					t.Errorf("review mail lacks %q:\n%s", want, m.data)
				}
			}
		case strings.Contains(m.data, "task-slow"):
			if !strings.Contains(m.data, "gantry task get task-slow") {
				t.Errorf("slow mail lacks its task get line:\n%s", m.data)
			}
		default:
			t.Errorf("unexpected mail:\n%s", m.data)
		}
	}

	// The alerts are events too.
	cons, err := env.JS.OrderedConsumer(context.Background(), wire.StreamAudit, ordered(wire.SubjectAlertAll))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 2 {
		t.Errorf("alert events = %d, want 2", info.NumPending)
	}
}

func TestFailingWebhookIsRetriedAndHoldsNothingBack(t *testing.T) {
	t.Parallel()
	smtpd := startSMTP(t, "ops", "pw")
	failing := startHook(t, "", http.StatusInternalServerError, http.StatusBadGateway)
	alerts := config.Alerts{
		CheckInterval: config.Duration(50 * time.Millisecond),
		Rules: []config.AlertRule{
			{Name: "to-hook", Kind: config.AlertNeedsReview, Types: []string{"exec"}, Sinks: []string{"flaky"}},
			{Name: "to-mail", Kind: config.AlertNeedsReview, Types: []string{"sql"}, Sinks: []string{"mail"}},
		},
		Webhooks: []config.Webhook{{Name: "flaky", URL: failing.srv.URL, RetryBase: config.Duration(300 * time.Millisecond), MaxAttempts: 5}},
		Email: []config.Email{{Name: "mail", Host: "127.0.0.1", Port: smtpd.addr.Port, Username: "ops", Password: "pw",
			From: "gantry@plant.example", To: []string{"ops@plant.example"}, CAFile: smtpd.caFile}},
	}
	env, _, reg := setup(t, Config{Alerts: alerts})
	needsReview(t, env, "task-exec", "exec", "boom")
	// The webhook fails its first attempt...
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := len(failing.received()); n < 1 {
			return fmt.Errorf("webhook calls = %d, want at least 1", n)
		}
		return nil
	})
	// ... and while it waits to retry, another rule's alert is mailed.
	needsReview(t, env, "task-sql", "sql", "deadlock")
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := len(smtpd.received()); n != 1 {
			return fmt.Errorf("mails = %d, want 1", n)
		}
		return nil
	})
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		calls := failing.received()
		if len(calls) != 3 {
			return fmt.Errorf("webhook calls = %d, want 3 (two failures, then success)", len(calls))
		}
		for _, c := range calls {
			if c.delivery != calls[0].delivery || c.alert.TaskID != "task-exec" {
				return fmt.Errorf("webhook call %+v: want the same delivery %q for task-exec", c, calls[0].delivery)
			}
		}
		return nil
	})
	// The webhook's last answer reaches the test's server before alertd
	// has read it and counted the delivery.
	check.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := sum(t, reg, "gantry_alertd_deliveries_total"); got < 4 {
			return fmt.Errorf("deliveries counted = %v, want the two retries, the webhook's and the mail's sends", got)
		}
		return nil
	})
}
