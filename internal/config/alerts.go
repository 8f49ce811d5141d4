package config

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Alerts is the alerts section: the rules alertd checks and where an alert
// goes (see docs/operations.md, Alerting).
type Alerts struct {
	// Rules say what raises an alert.
	Rules []AlertRule `yaml:"rules"`
	// Webhooks and Email are the sinks alerts go to.
	Webhooks []Webhook `yaml:"webhooks"`
	Email    []Email   `yaml:"email"`
	// CheckInterval is how often the rules that watch a state (long
	// running tasks, routes, resources, the leader, auditd's lag) are
	// checked. Defaults to 5s.
	CheckInterval Duration `yaml:"check_interval"`
}

// The kinds of alert rule.
const (
	// AlertNeedsReview: a task went to NEEDS_REVIEW (per type).
	AlertNeedsReview = "needs_review"
	// AlertLongRunning: a task has run longer than after.
	AlertLongRunning = "long_running"
	// AlertRouteDown: a route has not been AVAILABLE for after.
	AlertRouteDown = "route_down"
	// AlertResourceFault: a resource is in FAULT.
	AlertResourceFault = "resource_fault"
	// AlertLeaderLost: no scheduler has led for after.
	AlertLeaderLost = "leader_lost"
	// AlertAuditLag: auditd has more than max_pending events to store, or
	// the oldest is older than max_lag.
	AlertAuditLag = "audit_lag"
)

var alertKinds = []string{AlertNeedsReview, AlertLongRunning, AlertRouteDown, AlertResourceFault, AlertLeaderLost, AlertAuditLag}

// AlertRule is one rule.
type AlertRule struct {
	// Name names the rule in alerts and mails. Required, unique.
	Name string `yaml:"name"`
	// Kind is one of needs_review, long_running, route_down,
	// resource_fault, leader_lost, audit_lag.
	Kind string `yaml:"kind"`
	// Types limits needs_review and long_running to these task types.
	// Defaults to every type.
	Types []string `yaml:"types"`
	// After is how long the condition must hold: a task's run time
	// (long_running, required), a route's time out of AVAILABLE
	// (route_down) or the time without a leader (leader_lost). Defaults
	// to 0 (at once) for route_down and 30s for leader_lost.
	After Duration `yaml:"after"`
	// Window is the rate limit: at most one alert per rule and subject (a
	// task type, a route, a resource) per window; what happens in between
	// is counted into the next. Defaults to 10m.
	Window Duration `yaml:"window"`
	// MaxPending and MaxLag are audit_lag's thresholds (at least one).
	MaxPending int      `yaml:"max_pending"`
	MaxLag     Duration `yaml:"max_lag"`
	// Sinks names the webhooks and email sinks the rule's alerts go to.
	// Defaults to every sink.
	Sinks []string `yaml:"sinks"`
}

// Webhook is a sink that POSTs each alert event as JSON.
type Webhook struct {
	// Name names the sink for rules' sinks. Required, unique.
	Name string `yaml:"name"`
	// URL is where to POST (http or https).
	URL string `yaml:"url"`
	// Secret signs the body: header X-Gantry-Signature is
	// "sha256=" + hex(HMAC-SHA256(secret, body)). Exactly one of Secret,
	// SecretEnv (an environment variable) and SecretFile (relative to
	// this file) may be set; none sends no signature.
	Secret     string `yaml:"secret"`
	SecretEnv  string `yaml:"secret_env"`
	SecretFile string `yaml:"secret_file"`
	// Timeout bounds one POST. Defaults to 10s.
	Timeout Duration `yaml:"timeout"`
	// MaxAttempts bounds the POSTs of one alert; they are spaced by
	// RetryBase, doubling, at most 5m. Default to 6 and 1s.
	MaxAttempts int      `yaml:"max_attempts"`
	RetryBase   Duration `yaml:"retry_base"`
}

// Email is a sink that mails each alert over SMTP.
type Email struct {
	// Name names the sink for rules' sinks. Required, unique.
	Name string `yaml:"name"`
	// Host and Port are the SMTP server's (Port defaults to 587).
	Host string `yaml:"host"`
	Port int    `yaml:"port"`
	// Username authenticates (AUTH PLAIN, over TLS only); the password
	// comes from one of Password, PasswordEnv and PasswordFile.
	Username     string `yaml:"username"`
	Password     string `yaml:"password"`
	PasswordEnv  string `yaml:"password_env"`
	PasswordFile string `yaml:"password_file"`
	// From and To are the envelope and header addresses. Required.
	From string   `yaml:"from"`
	To   []string `yaml:"to"`
	// StartTLS upgrades the connection before anything is sent, and
	// refuses a server that cannot. Defaults to true.
	StartTLS *bool `yaml:"starttls"`
	// CAFile is a PEM file of the CA to verify the server with (relative
	// to this file). Defaults to the system's roots.
	CAFile string `yaml:"ca_file"`
	// Timeout, MaxAttempts and RetryBase work as a webhook's.
	Timeout     Duration `yaml:"timeout"`
	MaxAttempts int      `yaml:"max_attempts"`
	RetryBase   Duration `yaml:"retry_base"`
}

// ResolveSecret returns the secret given by value, the environment
// variable env or the file at path (whose surrounding whitespace is
// trimmed), whichever is set; what names it in errors.
func ResolveSecret(what, value, env, path string) (string, error) {
	switch {
	case env != "":
		v := strings.TrimSpace(os.Getenv(env))
		if v == "" {
			return "", fmt.Errorf("%w: %s: environment variable %s is not set", ErrInvalid, what, env)
		}
		return v, nil
	case path != "":
		data, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
		}
		return strings.TrimSpace(string(data)), nil
	}
	return value, nil
}

// relativeTo makes the alerts section's file names relative to dir.
func (a *Alerts) relativeTo(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	for i := range a.Webhooks {
		abs(&a.Webhooks[i].SecretFile)
	}
	for i := range a.Email {
		abs(&a.Email[i].PasswordFile)
		abs(&a.Email[i].CAFile)
	}
}

// validate checks the alerts section.
func (a *Alerts) validate() error {
	sinks := map[string]bool{}
	sink := func(where, name string) error {
		if !wire.ValidToken(name) {
			return fmt.Errorf("%s: name %q must be non-empty, without spaces, '.', '*' or '>'", where, name)
		}
		if sinks[name] {
			return fmt.Errorf("%s: sink %q defined twice", where, name)
		}
		sinks[name] = true
		return nil
	}
	for i, w := range a.Webhooks {
		where := fmt.Sprintf("alerts.webhooks[%d]", i)
		if err := sink(where, w.Name); err != nil {
			return err
		}
		u, err := url.Parse(w.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s: url %q: want an http:// or https:// URL", where, w.URL)
		}
		if n := nonEmpty(w.Secret, w.SecretEnv, w.SecretFile); n > 1 {
			return fmt.Errorf("%s: set at most one of secret, secret_env and secret_file", where)
		}
		if w.MaxAttempts < 0 || w.Timeout < 0 || w.RetryBase < 0 {
			return fmt.Errorf("%s: timeout, max_attempts and retry_base must not be negative", where)
		}
	}
	for i, e := range a.Email {
		where := fmt.Sprintf("alerts.email[%d]", i)
		if err := sink(where, e.Name); err != nil {
			return err
		}
		if e.Host == "" || e.From == "" || len(e.To) == 0 {
			return fmt.Errorf("%s: host, from and to are required", where)
		}
		if e.Port < 0 || e.Port > 65535 || e.MaxAttempts < 0 || e.Timeout < 0 || e.RetryBase < 0 {
			return fmt.Errorf("%s: port, timeout, max_attempts and retry_base must be in range", where)
		}
		if n := nonEmpty(e.Password, e.PasswordEnv, e.PasswordFile); n > 1 {
			return fmt.Errorf("%s: set at most one of password, password_env and password_file", where)
		}
	}
	rules := map[string]bool{}
	for i, r := range a.Rules {
		where := fmt.Sprintf("alerts.rules[%d]", i)
		if !wire.ValidToken(r.Name) || rules[r.Name] {
			return fmt.Errorf("%s: name %q must be unique, non-empty, without spaces, '.', '*' or '>'", where, r.Name)
		}
		rules[r.Name] = true
		if !slices.Contains(alertKinds, r.Kind) {
			return fmt.Errorf("%s: kind %q: want one of %s", where, r.Kind, strings.Join(alertKinds, ", "))
		}
		if r.After < 0 || r.Window < 0 || r.MaxPending < 0 || r.MaxLag < 0 {
			return fmt.Errorf("%s: after, window, max_pending and max_lag must not be negative", where)
		}
		if r.Kind == AlertLongRunning && r.After.Std() <= 0 {
			return fmt.Errorf("%s: a long_running rule needs after (the run time that is too long)", where)
		}
		if r.Kind == AlertAuditLag && r.MaxPending == 0 && r.MaxLag == 0 {
			return fmt.Errorf("%s: an audit_lag rule needs max_pending or max_lag", where)
		}
		if len(r.Types) > 0 && r.Kind != AlertNeedsReview && r.Kind != AlertLongRunning {
			return fmt.Errorf("%s: types apply to needs_review and long_running rules only", where)
		}
		for _, s := range r.Sinks {
			if !sinks[s] {
				return fmt.Errorf("%s: sink %q is not a webhook or email sink of alerts", where, s)
			}
		}
	}
	if a.CheckInterval < 0 || (a.CheckInterval > 0 && a.CheckInterval.Std() < 10*time.Millisecond) {
		return fmt.Errorf("alerts.check_interval %v: want at least 10ms", a.CheckInterval.Std())
	}
	return nil
}

func nonEmpty(s ...string) int {
	n := 0
	for _, v := range s {
		if v != "" {
			n++
		}
	}
	return n
}
