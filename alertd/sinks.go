package alertd

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/smtp"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/config"
)

// Defaults of the sinks.
const (
	// DefaultSinkTimeout bounds one delivery attempt.
	DefaultSinkTimeout = 10 * time.Second
	// DefaultMaxAttempts bounds the attempts of one delivery.
	DefaultMaxAttempts = 6
	// DefaultRetryBase is the wait after a failed attempt; it doubles up
	// to maxRetryWait.
	DefaultRetryBase = time.Second
	// SignatureHeader carries a webhook body's HMAC-SHA256, hex, after
	// "sha256=".
	SignatureHeader = "X-Gantry-Signature"
	// EventHeader carries the alert event's type.
	EventHeader = "X-Gantry-Event"
	// DeliveryHeader carries the alert event's id: the same on every
	// attempt, so a receiver can drop a repeat.
	DeliveryHeader = "X-Gantry-Delivery"
)

// maxRetryWait caps the wait between two attempts.
const maxRetryWait = 5 * time.Minute

// queueLen bounds the alerts waiting for one sink; more are dropped (and
// counted), never waited for.
const queueLen = 256

// sink delivers alerts in the background: enqueue never blocks.
type sink interface {
	enqueue(ev wire.Event, al wire.Alert)
	run(ctx context.Context)
}

// delivery is one alert for a sink.
type delivery struct {
	ev wire.Event
	al wire.Alert
}

// retrier is the queue and retry loop every sink shares; send makes one
// attempt.
type retrier struct {
	name     string
	log      *slog.Logger
	m        *metrics
	attempts int
	base     time.Duration
	timeout  time.Duration
	ch       chan delivery
	send     func(ctx context.Context, d delivery) error
}

func newRetrier(name string, log *slog.Logger, m *metrics, attempts int, base, timeout time.Duration) *retrier {
	return &retrier{name: name, log: log.With("sink", name), m: m, attempts: cmp.Or(attempts, DefaultMaxAttempts),
		base: cmp.Or(base, DefaultRetryBase), timeout: cmp.Or(timeout, DefaultSinkTimeout), ch: make(chan delivery, queueLen)}
}

func (r *retrier) enqueue(ev wire.Event, al wire.Alert) {
	select {
	case r.ch <- delivery{ev, al}:
	default:
		r.m.deliveries.WithLabelValues(r.name, "dropped").Inc()
		r.log.Warn("alert dropped: the sink's queue is full", "rule", al.Rule)
	}
}

func (r *retrier) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-r.ch:
			r.deliver(ctx, d)
		}
	}
}

// deliver makes up to attempts attempts, waiting base, 2·base... between
// them, until one succeeds or ctx ends.
func (r *retrier) deliver(ctx context.Context, d delivery) {
	wait := r.base
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, r.timeout)
		err := r.send(actx, d)
		cancel()
		if err == nil {
			r.m.deliveries.WithLabelValues(r.name, "sent").Inc()
			r.log.Debug("alert delivered", "rule", d.al.Rule, "attempt", attempt)
			return
		}
		if attempt >= r.attempts || ctx.Err() != nil {
			r.m.deliveries.WithLabelValues(r.name, "failed").Inc()
			r.log.Error("alert not delivered", "rule", d.al.Rule, "attempts", attempt, "err", err)
			return
		}
		r.m.deliveries.WithLabelValues(r.name, "retried").Inc()
		r.log.Warn("alert delivery failed; retrying", "rule", d.al.Rule, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			r.m.deliveries.WithLabelValues(r.name, "failed").Inc()
			return
		case <-t.C:
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// webhook POSTs each alert event as JSON.
type webhook struct {
	*retrier
	url    string
	secret []byte
	client *http.Client
}

func newWebhook(w config.Webhook, log *slog.Logger, m *metrics) (*webhook, error) {
	secret, err := config.ResolveSecret("webhook "+w.Name+" secret", w.Secret, w.SecretEnv, w.SecretFile)
	if err != nil {
		return nil, err
	}
	h := &webhook{retrier: newRetrier(w.Name, log, m, w.MaxAttempts, w.RetryBase.Std(), w.Timeout.Std()),
		url: w.URL, secret: []byte(secret), client: &http.Client{}}
	h.send = h.post
	return h, nil
}

// Sign returns the X-Gantry-Signature value of body under secret.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func (h *webhook) post(ctx context.Context, d delivery) error {
	body, err := json.Marshal(d.ev)
	if err != nil {
		return fmt.Errorf("encode alert: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "gantry-alertd")
	req.Header.Set(EventHeader, string(d.ev.Type))
	req.Header.Set(DeliveryHeader, d.ev.ID)
	if len(h.secret) > 0 {
		req.Header.Set(SignatureHeader, Sign(h.secret, body))
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("post webhook: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("post webhook: %s", resp.Status)
	}
	return nil
}

// mailer mails each alert over SMTP.
type mailer struct {
	*retrier
	cfg      config.Email
	password string
	tls      *tls.Config
	starttls bool
}

func newMailer(e config.Email, log *slog.Logger, m *metrics) (*mailer, error) {
	password, err := config.ResolveSecret("email "+e.Name+" password", e.Password, e.PasswordEnv, e.PasswordFile)
	if err != nil {
		return nil, err
	}
	e.Port = cmp.Or(e.Port, 587)
	tc := &tls.Config{ServerName: e.Host, MinVersion: tls.VersionTLS12}
	if e.CAFile != "" {
		pem, err := os.ReadFile(e.CAFile)
		if err != nil {
			return nil, fmt.Errorf("email %s: ca_file: %w", e.Name, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("email %s: ca_file %s holds no PEM certificate", e.Name, e.CAFile)
		}
	}
	ml := &mailer{retrier: newRetrier(e.Name, log, m, e.MaxAttempts, e.RetryBase.Std(), e.Timeout.Std()),
		cfg: e, password: password, tls: tc, starttls: e.StartTLS == nil || *e.StartTLS}
	ml.send = ml.mail
	return ml, nil
}

// mail sends one alert: STARTTLS (unless turned off), AUTH PLAIN when a
// user name is set, then the message.
func (ml *mailer) mail(ctx context.Context, d delivery) error {
	addr := net.JoinHostPort(ml.cfg.Host, strconv.Itoa(ml.cfg.Port))
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("smtp dial %s: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	c, err := smtp.NewClient(conn, ml.cfg.Host)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("smtp %s: %w", addr, err)
	}
	defer c.Close()
	if ml.starttls {
		if ok, _ := c.Extension("STARTTLS"); !ok {
			return errors.New("smtp: the server does not offer STARTTLS (set starttls: false to send in the clear)")
		}
		if err := c.StartTLS(ml.tls); err != nil {
			return fmt.Errorf("smtp starttls: %w", err)
		}
	}
	if ml.cfg.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", ml.cfg.Username, ml.password, ml.cfg.Host)); err != nil {
			return fmt.Errorf("smtp auth: %w", err)
		}
	}
	if err := c.Mail(ml.cfg.From); err != nil {
		return fmt.Errorf("smtp mail from: %w", err)
	}
	for _, to := range ml.cfg.To {
		if err := c.Rcpt(to); err != nil {
			return fmt.Errorf("smtp rcpt to %s: %w", to, err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("smtp data: %w", err)
	}
	if _, err := w.Write(message(ml.cfg.From, ml.cfg.To, d)); err != nil {
		return fmt.Errorf("smtp data: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("smtp data: %w", err)
	}
	return c.Quit()
}

// oneLine makes s safe for a mail header.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// message is the mail of one alert: what fired, the task's last error and
// the command that shows the task.
func message(from string, to []string, d delivery) []byte {
	al, ev := d.al, d.ev
	var b strings.Builder
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nSubject: [gantry] %s\r\nDate: %s\r\nMessage-ID: <%s@gantry>\r\n",
		oneLine(from), oneLine(strings.Join(to, ", ")), oneLine(al.Summary), ev.Time.Format(time.RFC1123Z), ev.ID)
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n")
	body := []string{al.Summary, "", "rule:    " + al.Rule + " (" + al.Kind + ")", "about:   " + al.Subject,
		fmt.Sprintf("count:   %d since %s", al.Count, al.Since.UTC().Format(time.RFC3339))}
	if al.TaskID != "" {
		body = append(body, "task:    "+al.TaskID+" ("+al.Queue+"/"+al.Type+")")
		if al.LastError != "" {
			body = append(body, "error:   "+al.LastError)
		}
		body = append(body, "", "  gantry task get "+al.TaskID)
	}
	if len(al.Details) > 0 {
		body = append(body, "", "details: "+string(al.Details))
	}
	body = append(body, "", fmt.Sprintf("event %s at %s on %s: gantry audit query --type %s", ev.ID, ev.Time.UTC().Format(time.RFC3339), ev.Host, ev.Type))
	for _, line := range body {
		// A line starting with a dot would end the DATA early in a
		// careless server; the smtp package's writer dot-stuffs it.
		b.WriteString(line + "\r\n")
	}
	return []byte(b.String())
}
