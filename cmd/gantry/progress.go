package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/gantry-dev/gantry/client"
	"github.com/gantry-dev/gantry/internal/clock"
)

// liveLine is one line on a terminal rewritten in place every tick: a
// spinner and the text its function returns. It prints nothing when its
// writer is not a terminal (a pipe, a file); a nil liveLine does nothing.
type liveLine struct {
	w    io.Writer
	text func() string

	mu    sync.Mutex
	frame int
	width int
	stop  chan struct{}
	done  chan struct{}
}

// spinner is the live line's spinner, one frame a tick.
var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// startLine starts a line on w showing text, redrawn every tick, or
// returns nil when tty is false.
func startLine(w io.Writer, tty bool, tick time.Duration, text func() string) *liveLine {
	if !tty {
		return nil
	}
	l := &liveLine{w: w, text: text, stop: make(chan struct{}), done: make(chan struct{})}
	l.draw()
	go func() {
		defer close(l.done)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				l.draw()
			}
		}
	}()
	return l
}

// draw rewrites the line.
func (l *liveLine) draw() {
	if l == nil {
		return
	}
	text := l.text()
	l.mu.Lock()
	defer l.mu.Unlock()
	line := spinner[l.frame%len(spinner)] + " " + text
	l.frame++
	pad := max(l.width-len(line), 0)
	l.width = len(line)
	fmt.Fprintf(l.w, "\r%s%s", line, strings.Repeat(" ", pad))
}

// end stops the line and clears it.
func (l *liveLine) end() {
	if l == nil {
		return
	}
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "\r%s\r", strings.Repeat(" ", l.width))
}

// progress shows a waited-for task on a live line: its state, its attempt
// and the time waited.
type progress struct {
	id    string
	start time.Time
	line  *liveLine

	mu    sync.Mutex
	state client.TaskState
	rec   client.TaskRecord
}

// startProgress starts the line for task id on w, redrawn every tick, or
// returns nil (which does nothing) when tty is false.
func startProgress(w io.Writer, tty bool, id string, tick time.Duration) *progress {
	if !tty {
		return nil
	}
	p := &progress{id: id, start: time.Now(), state: client.TaskWaiting}
	p.line = startLine(w, tty, tick, p.text)
	return p
}

// update takes a new record of the task and redraws the line when its
// state changed.
func (p *progress) update(rec client.TaskRecord) {
	if p == nil {
		return
	}
	p.mu.Lock()
	changed := rec.State != p.state
	p.rec, p.state = rec, rec.State
	p.mu.Unlock()
	if changed {
		p.line.draw()
	}
}

// text is the line's text.
func (p *progress) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := fmt.Sprintf("task %s %s", p.id, p.state)
	if p.rec.Attempts > 0 {
		line += fmt.Sprintf(", attempt %d", p.rec.Attempts)
	}
	if p.rec.State == client.TaskRetryWait && p.rec.RetryAt != nil {
		line += fmt.Sprintf(", retry in %v", clock.Round(max(time.Until(*p.rec.RetryAt), 0)))
	}
	return line + fmt.Sprintf(" (%v)", clock.Round(time.Since(p.start)).Truncate(time.Second))
}

// end stops the line and clears it.
func (p *progress) end() {
	if p == nil {
		return
	}
	p.line.end()
}
