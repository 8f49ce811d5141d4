package workers

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gantry-dev/gantry/broker/wire"
	"github.com/gantry-dev/gantry/internal/check"
	"github.com/gantry-dev/gantry/internal/rpc"
)

func TestExecOutputIsLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{OutputLineMax: 40}, nil)
	gate := t.TempDir() + "/gate"
	l := b.watchOutput(t, "live-1")
	script := `echo one; echo two >&2; echo "API_TOKEN=tok-123 user=bob"; echo "db is $DB_PASSWORD"; ` +
		`printf '%0100d\n' 7; printf 'no line end'; ` +
		`while [ ! -e ` + gate + ` ]; do sleep 0.02; done`
	b.publish(t, wire.TaskSubject("", "exec"), map[string]any{"id": "live-1",
		"payload": map[string]any{"cmd": []string{"sh", "-c", script}, "env": map[string]string{"DB_PASSWORD": "hunter22"}}})

	// While it runs: the lines so far, live, redacted, the long one cut.
	got := l.wait(t, 5)
	want := []wire.OutputLine{
		{Stream: wire.OutputStdout, Line: "one"},
		{Stream: wire.OutputStderr, Line: "two"},
		{Stream: wire.OutputStdout, Line: "API_TOKEN=[REDACTED] user=bob"},
		{Stream: wire.OutputStdout, Line: "db is [REDACTED]"},
		{Stream: wire.OutputStdout, Line: strings.Repeat("0", 40), Cut: true},
	}
	// stdout and stderr are read apart: compare each stream in order.
	for _, stream := range []string{wire.OutputStdout, wire.OutputStderr} {
		var g, w []string
		for _, x := range got {
			if x.Stream == stream {
				g = append(g, fmt.Sprintf("%s cut=%v", x.Line, x.Cut))
				if x.TaskID != "live-1" || x.Attempt != 1 || x.Seq == 0 || x.Time.IsZero() {
					t.Errorf("line %+v, want task live-1, attempt 1, a seq and a time", x)
				}
			}
		}
		for _, x := range want {
			if x.Stream == stream {
				w = append(w, fmt.Sprintf("%s cut=%v", x.Line, x.Cut))
			}
		}
		if strings.Join(g, "|") != strings.Join(w, "|") {
			t.Errorf("%s lines = %q, want %q", stream, g, w)
		}
	}

	// The worker running it answers with the lines so far.
	var reply wire.TaskOutputReply
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rpc.Request(ctx, b.env.NC, wire.SubjectTaskOutput, wire.TaskOutputRequest{ID: "live-1"}, &reply); err != nil {
		t.Fatalf("output request: %v", err)
	}
	if reply.ID != "live-1" || reply.Attempt != 1 || len(reply.Lines) != 5 {
		t.Errorf("output reply = %+v, want live-1, attempt 1, 5 lines", reply)
	}

	// The line without an end comes when the process ends; the kept tail
	// is redacted too.
	if err := touch(gate); err != nil {
		t.Fatal(err)
	}
	rec := b.waitState(t, "live-1", wire.TaskSucceeded, 10*time.Second)
	if last := l.wait(t, 6)[5]; last.Line != "no line end" {
		t.Errorf("last line = %q, want no line end", last.Line)
	}
	if strings.Contains(rec.Output, "tok-123") || strings.Contains(rec.Output, "hunter22") || !strings.Contains(rec.Output, "[REDACTED]") {
		t.Errorf("record output = %q, want its secrets redacted", rec.Output)
	}
}

func TestExecOutputRateNeverSlowsTheTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{OutputRate: 50}, nil)
	l := b.watchOutput(t, "chatty-1")
	start := time.Now()
	b.publish(t, wire.TaskSubject("", "exec"), `{"id":"chatty-1","payload":{"cmd":["sh","-c","i=0; while [ $i -lt 5000 ]; do echo line $i; i=$((i+1)); done; sleep 0.3; echo last"]}}`)
	b.waitState(t, "chatty-1", wire.TaskSucceeded, 20*time.Second)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("5000 lines took %v, want the task not slowed by its live output", took)
	}
	var got []wire.OutputLine
	check.For(t, 5*time.Second, 20*time.Millisecond, func() error {
		got = l.snapshot()
		if len(got) == 0 || got[len(got)-1].Line != "last" {
			return fmt.Errorf("%d lines, the last not yet seen", len(got))
		}
		return nil
	})
	dropped := 0
	for _, x := range got {
		dropped += x.Dropped
	}
	// A burst of 100, then 50 a second: most of the 5000 are dropped and
	// counted, and the seq numbers leave the gaps.
	if len(got) > 500 || dropped == 0 || len(got)+dropped != 5001 || got[len(got)-1].Seq != 5001 {
		t.Errorf("published %d lines, %d dropped, last seq %d; want at most 500 published and 5001 in all", len(got), dropped, got[len(got)-1].Seq)
	}
}

// touch creates an empty file at path.
func touch(path string) error { return os.WriteFile(path, nil, 0o600) }

// TestSecretsStayOutOfRecordsAndEvents: a failing exec task whose stderr
// and environment carry secrets leaves none of them in its record
// (last_error, output, the message kept for review) or in the messages of
// its events.
func TestSecretsStayOutOfRecordsAndEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, Config{Policy: fastPolicy}, nil)
	script := `echo "login with $DB_PASSWORD" >&2; echo "session=s-77 pass: p-88" >&2; echo "retrying, pw=hunter2" >&2; exit 3`
	b.publish(t, wire.TaskSubject("", "exec"), map[string]any{"id": "leaky-1", "payload": map[string]any{
		"cmd": []string{"sh", "-c", script}, "env": map[string]string{"DB_PASSWORD": "swordfish", "AUTH": "a-99"},
		"fail_exit_codes": []int{3}}})
	rec := b.waitState(t, "leaky-1", wire.TaskNeedsReview, 10*time.Second)
	secrets := []string{"swordfish", "hunter2", "s-77", "p-88", "a-99"}
	leaks := func(what, s string) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(s, sec) {
				t.Errorf("%s = %q, want %q redacted", what, s, sec)
			}
		}
	}
	leaks("last_error", rec.LastError)
	leaks("output", rec.Output)
	if rec.Message != nil {
		t.Errorf("record message = %s, want the message kept out of the record", rec.Message.Data)
	}
	for _, typ := range []wire.EventType{wire.EventNeedsReview, wire.EventTaskFinished} {
		for _, ev := range b.waitEvents(t, "leaky-1", typ, 1, 5*time.Second) {
			leaks(string(typ)+" message", ev.Message)
			leaks(string(typ)+" payload", string(ev.Payload))
		}
	}
}
