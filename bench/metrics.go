package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
)

// Sample is one look at the system: the gantry process (from its
// /metrics; zero when no metrics URL is known) and the broker's streams.
type Sample struct {
	// At is seconds since the scenario began.
	At         float64 `json:"at_s"`
	RSSBytes   int64   `json:"rss_bytes"`
	Goroutines int64   `json:"goroutines"`
	OpenFDs    int64   `json:"open_fds"`
	// TaskMsgs and TaskBytes are GANTRY_TASKS's (queued tasks).
	TaskMsgs  int64 `json:"tasks_stream_msgs"`
	TaskBytes int64 `json:"tasks_stream_bytes"`
	// AuditMsgs and AuditBytes are GANTRY_AUDIT's (kept per retention).
	AuditMsgs  int64 `json:"audit_stream_msgs"`
	AuditBytes int64 `json:"audit_stream_bytes"`
	// RecordBytes is the task record bucket's stream (KV_gantry_tasks).
	RecordBytes int64 `json:"task_records_bytes"`
	// AuditPending is what auditd has not stored yet.
	AuditPending int64 `json:"audit_pending"`
}

// minus is s - o, field by field (At is s's).
func (s Sample) minus(o Sample) Sample {
	return Sample{At: s.At, RSSBytes: s.RSSBytes - o.RSSBytes, Goroutines: s.Goroutines - o.Goroutines,
		OpenFDs: s.OpenFDs - o.OpenFDs, TaskMsgs: s.TaskMsgs - o.TaskMsgs, TaskBytes: s.TaskBytes - o.TaskBytes,
		AuditMsgs: s.AuditMsgs - o.AuditMsgs, AuditBytes: s.AuditBytes - o.AuditBytes,
		RecordBytes: s.RecordBytes - o.RecordBytes, AuditPending: s.AuditPending - o.AuditPending}
}

// sample takes a Sample, at seconds since start.
func (r *Run) sample(ctx context.Context, start time.Time) (Sample, error) {
	s := Sample{At: round(time.Since(start).Seconds(), 1)}
	if r.cfg.Metrics != "" {
		m, err := scrape(ctx, r.cfg.Metrics)
		if err != nil {
			return s, err
		}
		s.RSSBytes, s.Goroutines, s.OpenFDs = int64(m["process_resident_memory_bytes"]), int64(m["go_goroutines"]), int64(m["process_open_fds"])
	}
	for _, st := range []struct {
		name        string
		msgs, bytes *int64
	}{
		{wire.StreamTasks, &s.TaskMsgs, &s.TaskBytes},
		{wire.StreamAudit, &s.AuditMsgs, &s.AuditBytes},
		{"KV_" + wire.BucketTasks, nil, &s.RecordBytes},
	} {
		str, err := r.js.Stream(ctx, st.name)
		if err != nil {
			return s, fmt.Errorf("stream %s: %w", st.name, err)
		}
		info := str.CachedInfo()
		if st.msgs != nil {
			*st.msgs = int64(info.State.Msgs)
		}
		*st.bytes = int64(info.State.Bytes)
	}
	lag, err := r.cfg.Client.AuditLag(ctx)
	if err != nil {
		return s, err
	}
	s.AuditPending = int64(lag.Pending)
	return s, nil
}

// scrape reads the unlabelled samples of a Prometheus text page.
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s from %s", resp.Status, url)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}
