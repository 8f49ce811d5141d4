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

// progress shows a waited-for task on a terminal as one line rewritten in
// place: a spinner, the task's state, its attempt and the time waited. It
// prints nothing when its writer is not a terminal (a pipe, a file).
type progress struct {
	w     io.Writer
	id    string
	start time.Time

	mu    sync.Mutex
	state client.TaskState
	rec   client.TaskRecord
	frame int
	width int
	stop  chan struct{}
	done  chan struct{}
}

// spinner is the progress line's spinner, one frame a tick.
var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// startProgress starts the line for task id on w, redrawn every tick, or
// returns nil (which does nothing) when tty is false.
func startProgress(w io.Writer, tty bool, id string, tick time.Duration) *progress {
	if !tty {
		return nil
	}
	p := &progress{w: w, id: id, start: time.Now(), state: client.TaskWaiting,
		stop: make(chan struct{}), done: make(chan struct{})}
	p.draw()
	go func() {
		defer close(p.done)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
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
		p.draw()
	}
}

// draw rewrites the line.
func (p *progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := fmt.Sprintf("%s task %s %s", spinner[p.frame%len(spinner)], p.id, p.state)
	if p.rec.Attempts > 0 {
		line += fmt.Sprintf(", attempt %d", p.rec.Attempts)
	}
	if p.rec.State == client.TaskRetryWait && p.rec.RetryAt != nil {
		line += fmt.Sprintf(", retry in %v", clock.Round(max(time.Until(*p.rec.RetryAt), 0)))
	}
	line += fmt.Sprintf(" (%v)", clock.Round(time.Since(p.start)).Truncate(time.Second))
	p.frame++
	pad := max(p.width-len(line), 0)
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
}

// end stops the line and clears it.
func (p *progress) end() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
}
