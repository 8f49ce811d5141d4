package healthd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/egress"
	"github.com/gantry-dev/gantry/internal/config"
)

// maxBody bounds how much of a probe or expect answer is read.
const maxBody = 64 << 10

// probe runs the three stages against route r and returns the result,
// without state or score.
func (h *Healthd) probe(ctx context.Context, r config.Route) wire.HealthResult {
	res := wire.HealthResult{Route: r.ID, Time: h.cfg.Clock.Now()}
	fail := func(stage wire.ProbeStage, kind wire.ErrorKind, err error) wire.HealthResult {
		res.Stage, res.Kind, res.Error = stage, kind, err.Error()
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ProbeTimeout)
	defer cancel()
	proxy := r.ProxyOrDirect()

	// Stage 1: TCP connect to the first hop.
	addr, err := firstHop(proxy, r.ProbeURL)
	if err != nil {
		return fail(wire.StageTCP, wire.KindOther, err)
	}
	c, err := h.cfg.Dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail(wire.StageTCP, egress.ClassifyError(err), err)
	}
	_ = c.Close()

	// Stage 2: a light request through the route, timed.
	tr, err := egress.NewTransport(proxy, h.cfg.Dialer)
	if err != nil {
		return fail(wire.StageRequest, wire.KindOther, err)
	}
	tr.DisableKeepAlives = true
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	start := h.cfg.Clock.Now()
	status, _, err := fetch(ctx, client, r.ProbeURL)
	res.LatencyMS = h.cfg.Clock.Now().Sub(start).Milliseconds()
	if err != nil {
		return fail(wire.StageRequest, egress.ClassifyError(err), err)
	}
	if status >= 400 {
		return fail(wire.StageRequest, wire.KindBadStatus, fmt.Errorf("probe_url answered %d %s", status, http.StatusText(status)))
	}

	// Stage 3: the exit IP / region, when the route expects one.
	if r.ExpectIP == "" && r.ExpectRegion == "" {
		res.OK = true
		return res
	}
	status, body, err := fetch(ctx, client, r.ExpectURL)
	if err != nil {
		return fail(wire.StageExit, egress.ClassifyError(err), err)
	}
	if status >= 400 {
		return fail(wire.StageExit, wire.KindBadStatus, fmt.Errorf("expect_url answered %d %s", status, http.StatusText(status)))
	}
	ip, regions := parseExit(body)
	res.ExitIP = ip
	if len(regions) > 0 {
		res.Region = regions[0]
	}
	if r.ExpectIP != "" && !sameIP(ip, r.ExpectIP) {
		return fail(wire.StageExit, wire.KindWrongExit, fmt.Errorf("exit ip %q, want %s", ip, r.ExpectIP))
	}
	if r.ExpectRegion != "" && !hasRegion(regions, r.ExpectRegion) {
		return fail(wire.StageExit, wire.KindWrongExit, fmt.Errorf("exit region %q, want %s", res.Region, r.ExpectRegion))
	}
	res.OK = true
	return res
}

// firstHop is the address stage 1 connects to: the proxy's, or the probe
// URL's host and port for a direct route.
func firstHop(proxy, probeURL string) (string, error) {
	addr, err := egress.ProxyAddr(proxy)
	if err != nil || addr != "" {
		return addr, err
	}
	u, err := url.Parse(probeURL)
	if err != nil {
		return "", fmt.Errorf("probe_url %q: %w", probeURL, err)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// fetch GETs url and returns the status and up to maxBody bytes of body.
func fetch(ctx context.Context, client *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("User-Agent", "gantry-healthd")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, fmt.Errorf("read %s: %w", url, err)
	}
	return resp.StatusCode, body, nil
}

// parseExit reads what an expect URL reports: a JSON object with the IP
// under "ip", "origin" or "query" and the region under "region",
// "region_code", "country", "country_code" or "countryCode", or a plain-text
// IP.
func parseExit(body []byte) (ip string, regions []string) {
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		s := strings.TrimSpace(string(body))
		if net.ParseIP(s) != nil {
			return s, nil
		}
		return "", nil
	}
	for _, k := range []string{"ip", "origin", "query"} {
		if s, ok := m[k].(string); ok && s != "" {
			ip, _, _ = strings.Cut(s, ",")
			ip = strings.TrimSpace(ip)
			break
		}
	}
	for _, k := range []string{"region", "region_code", "country", "country_code", "countryCode"} {
		if s, ok := m[k].(string); ok && s != "" {
			regions = append(regions, s)
		}
	}
	return ip, regions
}

func sameIP(got, want string) bool {
	g, w := net.ParseIP(got), net.ParseIP(want)
	return g != nil && w != nil && g.Equal(w)
}

func hasRegion(regions []string, want string) bool {
	for _, r := range regions {
		if strings.EqualFold(r, want) {
			return true
		}
	}
	return false
}
