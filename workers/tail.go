package workers

import "sync"

// tail keeps the last n bytes written to it.
type tail struct {
	mu  sync.Mutex
	n   int
	buf []byte
	cut bool
}

func newTail(n int) *tail { return &tail{n: n} }

// Write keeps the end of p and of what came before, up to n bytes.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.n {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.n:]...)
		t.cut = true
	}
	return len(p), nil
}

// String returns what is kept, marked when the start was cut.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return "…" + string(t.buf)
	}
	return string(t.buf)
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
