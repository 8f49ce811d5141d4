package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/client"
)

// sparkMinutes is how many minutes the throughput sparkline shows.
const sparkMinutes = 60

// heartbeat is how often a live stream without news sends a comment, so
// that proxies and browsers keep it open.
const heartbeat = 15 * time.Second

// followRetry is how long following the finished tasks waits before it
// tries again after an error.
const followRetry = 5 * time.Second

func jetstreamOf(c *client.Client) (jetstream.JetStream, error) {
	js, err := jetstream.New(c.Conn())
	if err != nil {
		return nil, fmt.Errorf("dashboard: jetstream: %w", err)
	}
	return js, nil
}

// throughput counts the tasks that ended, per minute, from the
// TASK_FINISHED events of the audit stream.
type throughput struct {
	mu sync.Mutex
	// ok and bad count the tasks that SUCCEEDED, and those that did not,
	// by the minute (Unix seconds / 60).
	ok, bad map[int64]int
}

func newThroughput() *throughput {
	return &throughput{ok: map[int64]int{}, bad: map[int64]int{}}
}

func (t *throughput) add(ev client.Event) {
	var p struct {
		State wire.TaskState `json:"state"`
	}
	_ = json.Unmarshal(ev.Payload, &p)
	minute := ev.Time.Unix() / 60
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.State == wire.TaskSucceeded {
		t.ok[minute]++
	} else {
		t.bad[minute]++
	}
	if len(t.ok)+len(t.bad) > 4*sparkMinutes {
		for m := range t.ok {
			if m < minute-2*sparkMinutes {
				delete(t.ok, m)
			}
		}
		for m := range t.bad {
			if m < minute-2*sparkMinutes {
				delete(t.bad, m)
			}
		}
	}
}

// spark is the throughput of the last sparkMinutes minutes, oldest first.
type spark struct {
	OK, Bad []int
	// Total counts the tasks ended over them; Last those of the last
	// whole minute.
	Total, Last, Max int
}

func (t *throughput) series(now time.Time) spark {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := spark{OK: make([]int, sparkMinutes), Bad: make([]int, sparkMinutes)}
	end := now.Unix() / 60
	for i := range sparkMinutes {
		m := end - int64(sparkMinutes-1-i)
		s.OK[i], s.Bad[i] = t.ok[m], t.bad[m]
		s.Total += s.OK[i] + s.Bad[i]
		s.Max = max(s.Max, s.OK[i]+s.Bad[i])
	}
	s.Last = s.OK[sparkMinutes-2] + s.Bad[sparkMinutes-2]
	return s
}

// follow counts the TASK_FINISHED events of the last sparkMinutes and
// those that follow, until ctx ends.
func (t *throughput) follow(ctx context.Context, c *client.Client, log *slog.Logger) {
	since := time.Now().Add(-sparkMinutes * time.Minute)
	for ctx.Err() == nil {
		for ev, err := range c.TailAudit(ctx, client.AuditQuery{Type: wire.EventTaskFinished}, since) {
			if errors.Is(err, client.ErrMalformedEvent) {
				continue
			}
			if err != nil {
				log.Warn("dashboard cannot follow finished tasks", "err", err)
				break
			}
			t.add(ev)
			since = ev.Time.Add(time.Nanosecond)
		}
		select {
		case <-ctx.Done():
		case <-time.After(followRetry):
		}
	}
}

// probes keeps the last probe result of each route, as healthd publishes
// them.
type probes struct {
	mu   sync.Mutex
	last map[string]wire.HealthResult
}

func (p *probes) record(m *nats.Msg) {
	var r wire.HealthResult
	if json.Unmarshal(m.Data, &r) != nil || r.Route == "" {
		return
	}
	p.set(r)
}

func (p *probes) set(r wire.HealthResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.last[r.Route]; !ok || !r.Time.Before(cur.Time) {
		p.last[r.Route] = r
	}
}

func (p *probes) get(route string) (wire.HealthResult, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.last[route]
	return r, ok
}

// streamContext is r's context, ended also by Stop.
func (d *Dashboard) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	go func() {
		select {
		case <-d.done.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// sse writes Server-Sent Events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

// send writes one event; data is encoded as JSON.
func (s *sse) send(event, id string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if id != "" {
		if _, err := fmt.Fprintf(s.w, "id: %s\n", id); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) comment() error {
	if _, err := fmt.Fprint(s.w, ": keep-alive\n\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}

// item is one value of a live stream, or its error.
type item[T any] struct {
	v   T
	err error
}

// pump runs seq on a goroutine and hands its values over a channel, until
// ctx ends; the channel closes when seq does. wait ends ctx's use by the
// caller: it cancels and returns once the goroutine has.
func pump[T any](ctx context.Context, cancel context.CancelFunc, seq func(yield func(T, error) bool)) (ch <-chan item[T], wait func()) {
	out := make(chan item[T])
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for v, err := range seq {
			select {
			case out <- item[T]{v, err}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, func() { cancel(); <-done }
}

// liveEvent is an audit event as the live tail sends it.
type liveEvent struct {
	client.Event
	Time string `json:"time"`
	Ago  string `json:"clock"`
}

// auditLive streams the audit events the query's filters select, from
// "from" (the moment the page was rendered) or the browser's last event
// id, until the browser leaves.
func (d *Dashboard) auditLive(w http.ResponseWriter, r *http.Request) {
	q, _, err := auditFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	since := time.Now()
	if s := r.URL.Query().Get("from"); s != "" {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			since = t
		}
	}
	last := r.Header.Get("Last-Event-ID")
	if id, err := ulid.ParseStrict(last); err == nil {
		since = ulid.Time(id.Time())
	}
	relay(d, w, r, func(ctx context.Context) iter.Seq2[client.Event, error] {
		return d.c.TailAudit(ctx, q, since)
	}, func(s *sse, it item[client.Event]) bool {
		if errors.Is(it.err, client.ErrMalformedEvent) {
			return true
		}
		if it.err != nil {
			_ = s.send("problem", "", it.err.Error())
			return false
		}
		if it.v.ID <= last {
			return true
		}
		ev := liveEvent{Event: it.v, Time: it.v.Time.Format(time.RFC3339Nano), Ago: it.v.Time.Local().Format("15:04:05.000")}
		return s.send("audit", it.v.ID, ev) == nil
	}, nil)
}

// taskOutput streams a task's output: the lines so far, then its live
// lines until it ends ("end" then names its state).
func (d *Dashboard) taskOutput(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	relay(d, w, r, func(ctx context.Context) iter.Seq2[client.OutputLine, error] {
		return d.c.TaskLogs(ctx, id, client.LogOptions{Follow: true})
	}, func(s *sse, it item[client.OutputLine]) bool {
		if it.err != nil {
			_ = s.send("problem", "", it.err.Error())
			return false
		}
		return s.send("line", "", it.v) == nil
	}, func(ctx context.Context, s *sse) {
		state := ""
		if rec, err := d.c.Task(ctx, id); err == nil {
			state = string(rec.State)
		}
		_ = s.send("end", "", state)
	})
}

// relay streams what open's sequence yields to the browser as server-sent
// events, with a heartbeat comment when there is no news, until the
// browser leaves or send says to stop. send sends one item, or reports its
// error, and says whether to go on; end, when not nil, runs when the
// sequence ends.
func relay[T any](d *Dashboard, w http.ResponseWriter, r *http.Request, open func(ctx context.Context) iter.Seq2[T, error], send func(s *sse, it item[T]) bool, end func(ctx context.Context, s *sse)) {
	ctx, cancel := d.streamContext(r)
	s := startSSE(w)
	items, wait := pump(ctx, cancel, open(ctx))
	defer wait()
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if s.comment() != nil {
				return
			}
		case it, ok := <-items:
			if !ok {
				if end != nil {
					end(ctx, s)
				}
				return
			}
			if !send(s, it) {
				return
			}
		}
	}
}
