package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAlertsSection(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(`alerts:
  check_interval: 1s
  rules:
    - {name: review, kind: needs_review, types: [exec], window: 5m, sinks: [hook, mail]}
    - {name: slow, kind: long_running, after: 30m}
    - {name: audit, kind: audit_lag, max_pending: 100}
  webhooks:
    - {name: hook, url: "https://hooks.example.com/x", secret_env: HOOK_SECRET}
  email:
    - {name: mail, host: smtp.example.com, from: a@example.com, to: [b@example.com], starttls: false}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	a := f.Alerts
	if len(a.Rules) != 3 || a.Rules[0].Window.Std() != 5*time.Minute || a.CheckInterval.Std() != time.Second ||
		a.Webhooks[0].SecretEnv != "HOOK_SECRET" || *a.Email[0].StartTLS {
		t.Errorf("alerts = %+v, want the rules, sinks and settings written", a)
	}
}

func TestAlertsSectionErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, want string }{
		{"alerts:\n  rules: [{name: r, kind: nope}]", `kind "nope"`},
		{"alerts:\n  rules: [{name: r, kind: long_running}]", "needs after"},
		{"alerts:\n  rules: [{name: r, kind: audit_lag}]", "max_pending or max_lag"},
		{"alerts:\n  rules: [{name: r, kind: route_down, types: [x]}]", "types apply"},
		{"alerts:\n  rules: [{name: r, kind: needs_review, sinks: [ghost]}]", `sink "ghost"`},
		{"alerts:\n  rules: [{name: r, kind: needs_review}, {name: r, kind: needs_review}]", "unique"},
		{"alerts:\n  webhooks: [{name: h, url: 'ftp://x'}]", "want an http"},
		{"alerts:\n  webhooks: [{name: h, url: 'http://x', secret: a, secret_env: B}]", "at most one"},
		{"alerts:\n  email: [{name: m, host: h}]", "host, from and to"},
		{"alerts:\n  email: [{name: m, host: h, from: a, to: [b]}]\n  webhooks: [{name: m, url: 'http://x'}]", "defined twice"},
		{"alerts:\n  rules: [{name: r, kind: needs_review, windw: 1m}]", `unknown key "windw"`},
	} {
		_, err := Parse([]byte(tc.doc))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid mentioning %q", tc.doc, err, tc.want)
		}
	}
}

func TestResolveSecret(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(path, []byte(" s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ResolveSecret("x", "", "", path); err != nil || got != "s3cret" {
		t.Errorf("ResolveSecret(file) = %q, %v; want s3cret", got, err)
	}
	if got, err := ResolveSecret("x", "plain", "", ""); err != nil || got != "plain" {
		t.Errorf("ResolveSecret(value) = %q, %v; want plain", got, err)
	}
	if _, err := ResolveSecret("x", "", "GANTRY_TEST_UNSET_SECRET_VAR", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("ResolveSecret(unset env) = %v, want ErrInvalid", err)
	}
}
