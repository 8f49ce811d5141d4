package workers

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	p := Policy{BackoffBase: time.Second, BackoffMax: time.Minute}
	for _, tc := range []struct {
		n      int
		jitter float64
		want   time.Duration
	}{
		{1, 0.5, time.Second},
		{2, 0.5, 2 * time.Second},
		{3, 0.5, 4 * time.Second},
		{3, 0, 3200 * time.Millisecond},
		{3, 0.999999, 4800 * time.Millisecond},
		{7, 0.5, time.Minute},
		{7, 0.999999, time.Minute},
		{7, 0, 48 * time.Second},
		{1000, 0.5, time.Minute},
	} {
		got := backoff(p, tc.n, func() float64 { return tc.jitter }).Round(100 * time.Millisecond)
		if got != tc.want {
			t.Errorf("backoff(n=%d, jitter=%v) = %v, want %v", tc.n, tc.jitter, got, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err   error
		class Class
		delay time.Duration
	}{
		{errors.New("x"), ClassRetry, 0},
		{Permanent(errors.New("x")), ClassPermanent, 0},
		{fmt.Errorf("wrapped: %w", Permanent(errors.New("x"))), ClassPermanent, 0},
		{RetryAfter(errors.New("x"), 3*time.Second), ClassDelay, 3 * time.Second},
		{fmt.Errorf("%w: x", ErrCancelled), ClassCancelled, 0},
		{fmt.Errorf("%w: x", errInterrupted), ClassInterrupted, 0},
	} {
		c, d := Classify(tc.err)
		if c != tc.class || d != tc.delay {
			t.Errorf("Classify(%v) = %v, %v, want %v, %v", tc.err, c, d, tc.class, tc.delay)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":                              0,
		"5":                             5 * time.Second,
		"1500ms":                        1500 * time.Millisecond,
		"Mon, 30 Nov 2026 12:00:30 GMT": 30 * time.Second,
		"soon":                          0,
	} {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestDecodeTask(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body, wantErr string
	}{
		{``, ""},
		{`{}`, ""},
		{`{"id":"a","payload":{"x":1},"priority":3,"max_attempts":2,"timeout":"5s","not_before":"2026-11-30T12:00:00Z","key":"k","extra":1}`, ""},
		{`{"payload":`, "unexpected end"},
		{`null`, "JSON object"},
		{`"s"`, "JSON object"},
		{`{"max_attempts":"3"}`, `field "max_attempts"`},
		{`{"max_attempts":-1}`, "max_attempts -1"},
		{`{"timeout":"soon"}`, "timeout"},
		{`{"timeout":"-1s"}`, "timeout"},
		{`{"not_before":"tomorrow"}`, "not_before"},
		{`{"id":"a b"}`, "id"},
		{`{"resource":"a.b"}`, "resource"},
	} {
		_, err := DecodeTask([]byte(tc.body), 1024)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("DecodeTask(%s) = %v, want no error", tc.body, err)
		case tc.wantErr != "" && (err == nil || !errors.Is(err, ErrBadTask) || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("DecodeTask(%s) = %v, want ErrBadTask containing %q", tc.body, err, tc.wantErr)
		}
	}
	if _, err := DecodeTask(make([]byte, 2000), 1024); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("DecodeTask(2000 bytes) = %v, want over the limit", err)
	}
}

func FuzzDecodeTask(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"id":"a","payload":{"cmd":["x"]},"timeout":"1s"}`, `{"not_before":"2026-11-30T12:00:00Z"}`,
		`{"max_attempts":1e99}`, `[`, `{"payload":"\u0000"}`, `{"id":"` + strings.Repeat("a", 200) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		task, err := DecodeTask(data, 4096)
		if err != nil {
			if !errors.Is(err, ErrBadTask) {
				t.Fatalf("DecodeTask error %v does not wrap ErrBadTask", err)
			}
			return
		}
		// What decodes is valid, and survives a round trip.
		if err := validateTask(task); err != nil {
			t.Fatalf("decoded task invalid: %v", err)
		}
		again, err := json.Marshal(task)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		task2, err := DecodeTask(again, 0)
		if err != nil {
			t.Fatalf("decode of re-encoded %s: %v", again, err)
		}
		again2, err := json.Marshal(task2)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if string(again) != string(again2) {
			t.Fatalf("round trip changed the task: %s != %s", again, again2)
		}
	})
}

func TestTail(t *testing.T) {
	t.Parallel()
	tl := newTail(5)
	_, _ = tl.Write([]byte("abc"))
	if got := tl.String(); got != "abc" {
		t.Errorf("tail = %q, want abc", got)
	}
	_, _ = tl.Write([]byte("defgh"))
	if got := tl.String(); got != "…defgh" {
		t.Errorf("tail = %q, want …defgh", got)
	}
	if got := tailString("0123456789", 3); got != "…789" {
		t.Errorf("tailString = %q, want …789", got)
	}
}

func TestSetResult(t *testing.T) {
	t.Parallel()
	task := NewTask(TaskOptions{ID: "t"})
	if got := task.Result(); got != nil {
		t.Errorf("Result before SetResult = %s, want nil", got)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"rows_affected":1}`, `{"rows_affected":1}`},
		{`{not json`, `{"error":"the handler's result is not JSON"}`},
		{`"` + strings.Repeat("x", MaxResult) + `"`, fmt.Sprintf(`{"error":"the handler's result of %d bytes is over the limit of %d"}`, MaxResult+2, MaxResult)},
	} {
		task.SetResult(json.RawMessage(tc.in))
		if got := string(task.Result()); got != tc.want {
			t.Errorf("Result after SetResult(%.20s…) = %.80s, want %s", tc.in, got, tc.want)
		}
	}
}
