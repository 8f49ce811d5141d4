package config

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRoutes(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(`
routes:
  - {id: office, probe_url: "https://example.com/"}
  - id: plant-proxy
    proxy: "socks5://bob:hunter2@10.0.0.7:1080"
    probe_url: "http://example.com/"
    interval: 10s
    expect_ip: 10.0.0.7
    expect_region: eu
    expect_url: "https://ipinfo.example/json"
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.Routes[0].ProxyOrDirect(), "direct"; got != want {
		t.Errorf("ProxyOrDirect = %q, want %q", got, want)
	}
	if got, want := f.Routes[1].ExpectRegion, "eu"; got != want {
		t.Errorf("ExpectRegion = %q, want %q", got, want)
	}
}

func TestParseRouteErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"no probe url", "routes: [{id: a}]\n", "probe_url: required"},
		{"bad probe url", "routes: [{id: a, probe_url: 'ftp://x/'}]\n", `"ftp://x/" is not an http:// or https:// URL`},
		{"bad scheme", "routes: [{id: a, proxy: 'https://h:1', probe_url: 'http://x/'}]\n", "want an http:// or socks5:// URL"},
		{"no port", "routes: [{id: a, proxy: 'socks5://h', probe_url: 'http://x/'}]\n", "want host:port"},
		{"secret not echoed", "routes: [{id: a, proxy: 'ftp://u:hunter2@h:1', probe_url: 'http://x/'}]\n", "ftp://u:xxxxx@h:1"},
		{"bad id", "routes: [{id: 'a:b', probe_url: 'http://x/'}]\n", `id "a:b" must be`},
		{"auto id", "routes: [{id: auto, probe_url: 'http://x/'}]\n", `id "auto" must be`},
		{"short interval", "routes: [{id: a, probe_url: 'http://x/', interval: 10ms}]\n", "shorter than 1s"},
		{"bad ip", "routes: [{id: a, probe_url: 'http://x/', expect_ip: nope, expect_url: 'http://x/'}]\n", `expect_ip "nope" is not an IP`},
		{"expect without url", "routes: [{id: a, probe_url: 'http://x/', expect_region: eu}]\n", "need expect_url"},
		{"bad expect url", "routes: [{id: a, probe_url: 'http://x/', expect_ip: 1.2.3.4, expect_url: 'x'}]\n", "expect_url:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.doc))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want ErrInvalid containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Parse error = %v, want the proxy password redacted", err)
			}
		})
	}
}
