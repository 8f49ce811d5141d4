package workers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gantry-dev/gantry/broker/wire"
)

// decodePayload decodes a task's payload into v; unknown fields and wrong
// types are permanent failures.
func decodePayload(t *Task, v any) error {
	if len(t.Payload) == 0 || string(t.Payload) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(t.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return permanentf("%s payload: %v", t.Type, err)
	}
	return nil
}

// runNoop is the built-in noop: it succeeds after the optional sleep.
func (w *Workers) runNoop(ctx context.Context, t *Task) error {
	var p wire.NoopPayload
	if err := decodePayload(t, &p); err != nil {
		return err
	}
	if p.Sleep == "" {
		return nil
	}
	d, err := time.ParseDuration(p.Sleep)
	if err != nil || d < 0 {
		return permanentf("noop payload: sleep %q: want a Go duration such as 1s", p.Sleep)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// runHTTP is the built-in http: 2xx succeeds; 429 and 503 are delayed
// retries honouring Retry-After; other 5xx, resets and timeouts are
// retried; other statuses are permanent failures.
func (w *Workers) runHTTP(ctx context.Context, t *Task) error {
	var p wire.HTTPPayload
	if err := decodePayload(t, &p); err != nil {
		return err
	}
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return permanentf("http payload: url %q: want an absolute http:// or https:// URL", p.URL)
	}
	method := strings.ToUpper(cmp.Or(p.Method, http.MethodGet))
	req, err := http.NewRequestWithContext(ctx, method, p.URL, strings.NewReader(p.Body))
	if err != nil {
		return permanentf("http payload: %v", err)
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	client := w.cfg.HTTPClient
	routeID := ""
	if p.Route != "" {
		if w.cfg.Routes == nil {
			return permanentf("http payload: route %q asked, but this worker has no egress routes configured", p.Route)
		}
		rt, id, err := w.cfg.Routes.Transport(ctx, p.Route)
		if err != nil {
			return fmt.Errorf("route %s: %w", p.Route, err)
		}
		routeID = id
		client = &http.Client{Transport: rt, Timeout: client.Timeout}
	}
	resp, err := client.Do(req)
	if err != nil {
		if routeID != "" {
			w.cfg.Routes.Report(context.WithoutCancel(ctx), routeID, err)
		}
		return fmt.Errorf("http %s %s: %w", method, p.URL, err)
	}
	defer resp.Body.Close()
	if routeID != "" {
		w.cfg.Routes.Report(context.WithoutCancel(ctx), routeID, nil)
	}
	tail := newTail(w.cfg.OutputTail)
	_, copyErr := io.Copy(tail, resp.Body)
	t.SetOutput(tail.String())
	status := fmt.Errorf("http %s %s: %s", method, p.URL, resp.Status)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if copyErr != nil {
			return fmt.Errorf("http %s %s: read body: %w", method, p.URL, copyErr)
		}
		return nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		return RetryAfter(status, parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()))
	case resp.StatusCode >= 500:
		return status
	default:
		return Permanent(status)
	}
}

// runSQL is the built-in sql: one statement against a database of
// Config.Databases (see package sqltask), its result kept on the task's
// record. Database errors come classified: permanent ones (syntax,
// permission, missing object, constraint, data) carry a Permanent method.
func (w *Workers) runSQL(ctx context.Context, t *Task) error {
	var p wire.SQLPayload
	if err := decodePayload(t, &p); err != nil {
		return err
	}
	res, err := w.sql.Run(ctx, p)
	if err != nil {
		return err
	}
	data, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("encode sql result: %w", err)
	}
	t.SetResult(data)
	return nil
}

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date. Zero
// means no usable hint.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d
	}
	return 0
}

// ErrNoHandler marks an attempt of a task whose type has no handler: no
// built-in or registered one, and none answered on gantry.handlers.<type>.
// It is a delayed retry after the policy's NoHandlerDelay, which does not
// use up an attempt: a handler that restarts finds its tasks waiting.
var ErrNoHandler = errors.New("no handler answered")

// ErrHandlerSilent marks an attempt whose remote handler sent progress
// heartbeats and then fell silent for longer than the heartbeat window:
// it died or lost its connection. The attempt is retried.
var ErrHandlerSilent = errors.New("handler stopped sending heartbeats")

// runRemote sends the task to the handler answering on
// gantry.handlers.<type> and waits for its reply on an inbox of its own,
// where the handler may first send progress messages (wire.HeaderProgress):
// heartbeats, whose bodies are output lines. Once one came, a silence
// longer than the heartbeat window fails the attempt.
func (w *Workers) runRemote(ctx context.Context, t *Task) error {
	cp, err := t.Checkpoint(ctx)
	if err != nil {
		return err
	}
	data, err := json.Marshal(wire.HandlerRequest{ID: t.ID, Type: t.Type, Queue: t.Queue, Attempt: t.Attempt,
		Payload: t.Payload, Resource: t.Resource, Checkpoint: cp, Deadline: t.Deadline})
	if err != nil {
		return fmt.Errorf("encode handler request: %w", err)
	}
	subj := wire.HandlerSubject(t.Type)
	inbox := w.nc.NewInbox()
	sub, err := w.nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("handler %s: subscribe to replies: %w", subj, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := nats.NewMsg(subj)
	msg.Reply = inbox
	msg.Data = data
	msg.Header.Set(nats.MsgIdHdr, t.ID)
	msg.Header.Set(wire.HeaderHeartbeatWindow, w.cfg.HeartbeatWindow.String())
	if err := w.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("handler %s: %w", subj, err)
	}
	progress := newTail(w.cfg.OutputTail)
	lines := t.tee(wire.OutputHandler, progress)
	beating := false
	var resp *nats.Msg
	for resp == nil {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if beating {
			wctx, cancel = context.WithTimeoutCause(ctx, w.cfg.HeartbeatWindow, ErrHandlerSilent)
		}
		m, err := sub.NextMsgWithContext(wctx)
		silent := errors.Is(context.Cause(wctx), ErrHandlerSilent) && ctx.Err() == nil
		cancel()
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return RetryAfter(fmt.Errorf("%w on %s: no built-in or registered handler for type %q, and no service listening (is the handler running?)", ErrNoHandler, subj, t.Type), 0)
		case err != nil && silent:
			return fmt.Errorf("handler %s: %w for %v (did it stop?)", subj, ErrHandlerSilent, w.cfg.HeartbeatWindow)
		case err != nil:
			return fmt.Errorf("handler %s: %w", subj, err)
		case m.Header[wire.HeaderProgress] != nil:
			beating = true
			if len(m.Data) > 0 {
				_, _ = lines.Write(m.Data)
				if m.Data[len(m.Data)-1] != '\n' {
					_, _ = lines.Write([]byte{'\n'})
				}
			}
		default:
			resp = m
		}
	}
	if raw := resp.Header.Get(wire.HeaderCheckpoint); raw != "" {
		var cp wire.Checkpoint
		if err := json.Unmarshal([]byte(raw), &cp); err != nil {
			w.log.Warn("bad checkpoint from handler", "task_id", t.ID, "err", err)
		} else if err := t.SaveCheckpoint(ctx, cp); err != nil {
			return err
		}
	}
	switch {
	case len(resp.Data) > 0:
		t.SetOutput(tailString(string(resp.Data), w.cfg.OutputTail))
	case beating:
		t.SetOutput(progress.String())
	}
	msgErr := resp.Header.Get(wire.HeaderError)
	if msgErr == "" {
		return nil
	}
	herr := fmt.Errorf("handler %s: %s", subj, msgErr)
	switch resp.Header.Get(wire.HeaderErrorClass) {
	case wire.ErrorClassPermanent:
		return Permanent(herr)
	case wire.ErrorClassDelay:
		return RetryAfter(herr, parseRetryAfter(resp.Header.Get(wire.HeaderRetryAfter), time.Now()))
	}
	return herr
}
