package workers

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/rpc"
)

// liveOutput publishes the output lines of one attempt on
// gantry.output.<task id> as they come, redacted, and keeps the last ones
// for a request on wire.SubjectTaskOutput. It never blocks the task: a
// line over the rate limit is dropped (and counted in the next line's
// dropped), a line over the length bound is cut.
type liveOutput struct {
	nc      *nats.Conn
	log     *slog.Logger
	subject string
	taskID  string
	attempt int
	maxLine int
	keep    int
	rate    float64
	burst   float64
	// payload is the task's: the values under its secret-looking keys are
	// redacted wherever they show in a line (secrets, read on the first
	// line).
	payload json.RawMessage

	mu          sync.Mutex
	seq         uint64
	tokens      float64
	last        time.Time
	dropped     int
	recent      []wire.OutputLine
	recentBytes int
	writers     []*lineWriter
	secrets     []string
	secretsRead bool
}

// newLiveOutput returns the live output of one attempt of task id.
func (w *Workers) newLiveOutput(id string, attempt int, payload json.RawMessage) *liveOutput {
	rate := float64(w.cfg.OutputRate)
	return &liveOutput{nc: w.nc, log: w.log, subject: wire.OutputSubject(id), taskID: id, attempt: attempt,
		maxLine: w.cfg.OutputLineMax, keep: w.cfg.OutputTail, rate: rate, burst: 2 * rate, tokens: 2 * rate,
		last: time.Now(), payload: payload}
}

// tee returns a writer that writes to w and publishes each line written
// to it as a line of stream; close publishes the last line if it has no
// line end. On a nil o (a task run outside a worker) it only writes to w.
func (o *liveOutput) tee(stream string, w io.Writer) io.Writer {
	lw := &lineWriter{o: o, stream: stream, next: w}
	if o != nil {
		o.mu.Lock()
		o.writers = append(o.writers, lw)
		o.mu.Unlock()
	}
	return lw
}

// close publishes the lines under way of every writer tee returned.
func (o *liveOutput) close() {
	o.mu.Lock()
	writers := o.writers
	o.mu.Unlock()
	for _, lw := range writers {
		lw.close()
	}
}

// line publishes one line of stream.
func (o *liveOutput) line(stream, text string, cut bool) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tokens = min(o.burst, o.tokens+now.Sub(o.last).Seconds()*o.rate)
	o.last = now
	o.seq++
	if o.tokens < 1 {
		o.dropped++
		return
	}
	o.tokens--
	l := wire.OutputLine{TaskID: o.taskID, Attempt: o.attempt, Seq: o.seq, Stream: stream, Time: now.UTC(),
		Line: o.redact(text), Cut: cut, Dropped: o.dropped}
	o.dropped = 0
	o.recent = append(o.recent, l)
	o.recentBytes += len(l.Line)
	for len(o.recent) > 1 && o.recentBytes > o.keep {
		o.recentBytes -= len(o.recent[0].Line)
		o.recent = o.recent[1:]
	}
	data, err := json.Marshal(l)
	if err == nil {
		err = o.nc.Publish(o.subject, data)
	}
	if err != nil {
		o.log.Debug("publish output line", "task_id", o.taskID, "err", err)
	}
}

// redact hides the secrets of one line of output; o.mu is held.
func (o *liveOutput) redact(text string) string {
	if !o.secretsRead {
		o.secrets, o.secretsRead = secretValues(o.payload), true
	}
	return redactText(wire.RedactLine(text), o.secrets)
}

// lines returns the attempt's last lines, oldest first.
func (o *liveOutput) lines() []wire.OutputLine {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]wire.OutputLine{}, o.recent...)
}

// lineWriter splits what is written to it into lines for its liveOutput,
// after writing it to next.
type lineWriter struct {
	o      *liveOutput
	stream string
	next   io.Writer

	mu  sync.Mutex
	buf []byte
	cut bool
}

// Write writes p to next and publishes each line it completes.
func (lw *lineWriter) Write(p []byte) (int, error) {
	n, err := lw.next.Write(p)
	if lw.o == nil {
		return n, err
	}
	lw.mu.Lock()
	defer lw.mu.Unlock()
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			lw.add(p)
			break
		}
		lw.add(p[:i])
		lw.flush()
		p = p[i+1:]
	}
	return n, err
}

// add appends to the line under way, up to the line bound.
func (lw *lineWriter) add(p []byte) {
	if room := lw.o.maxLine - len(lw.buf); len(p) > room {
		p, lw.cut = p[:max(room, 0)], true
	}
	lw.buf = append(lw.buf, p...)
}

func (lw *lineWriter) flush() {
	lw.o.line(lw.stream, strings.TrimSuffix(string(lw.buf), "\r"), lw.cut)
	lw.buf, lw.cut = lw.buf[:0], false
}

// close publishes the line under way, if any.
func (lw *lineWriter) close() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if len(lw.buf) > 0 || lw.cut {
		lw.flush()
	}
}

// secretValues returns the string values of payload under secret-looking
// keys, at any depth (an exec task's env, an http task's headers), of at
// least 4 bytes: the output of the task hides them.
func secretValues(payload json.RawMessage) []string {
	if len(payload) == 0 || !json.Valid(payload) || string(wire.RedactJSON(payload)) == string(payload) {
		return nil
	}
	var v any
	if json.Unmarshal(payload, &v) != nil {
		return nil
	}
	var out []string
	var walk func(v any, secret bool)
	walk = func(v any, secret bool) {
		switch x := v.(type) {
		case map[string]any:
			for k, val := range x {
				walk(val, secret || wire.IsSecretKey(k))
			}
		case []any:
			for _, val := range x {
				walk(val, secret)
			}
		case string:
			if secret && len(x) >= 4 {
				out = append(out, x)
			}
		}
	}
	walk(v, false)
	return out
}

// redactText replaces every secret in s.
func redactText(s string, secrets []string) string {
	for _, sec := range secrets {
		if strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, wire.Redacted)
		}
	}
	return s
}

// redactOutput redacts an attempt's kept output, line by line, as its
// live lines are.
func redactOutput(s string, payload json.RawMessage) string {
	if s == "" {
		return s
	}
	secrets := secretValues(payload)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = redactText(wire.RedactLine(l), secrets)
	}
	return strings.Join(lines, "\n")
}

// trackOutput registers the live output of task id's running attempt for
// output requests; the returned function unregisters it.
func (w *Workers) trackOutput(id string, o *liveOutput) func() {
	w.outputs.Store(id, o)
	return func() { w.outputs.CompareAndDelete(id, o) }
}

// taskOutput answers an output request for a task this process runs with
// its last lines; the others stay silent.
func (w *Workers) taskOutput(req micro.Request) {
	var in wire.TaskOutputRequest
	if err := rpc.Decode(req, &in); err != nil {
		if err := rpc.Respond(req, wire.TaskOutputReply{}, err); err != nil {
			w.log.Warn("answer output request", "err", err)
		}
		return
	}
	v, ok := w.outputs.Load(in.ID)
	if !ok {
		return
	}
	o := v.(*liveOutput)
	reply := wire.TaskOutputReply{ID: in.ID, Attempt: o.attempt, Worker: w.cfg.Name, Lines: o.lines()}
	if err := rpc.Respond(req, reply, nil); err != nil {
		w.log.Warn("answer output request", "task_id", in.ID, "err", err)
	}
}
