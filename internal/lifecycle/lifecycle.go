// Package lifecycle holds the one piece of the actor contract that every
// component repeats: a stop signal that Stop closes once, safe before Run,
// during it and after it has returned.
package lifecycle

import (
	"context"
	"sync"
)

// Stop is a stop signal. The zero value is ready to use; it must not be
// copied after first use.
type Stop struct {
	init sync.Once
	once sync.Once
	ch   chan struct{}
}

func (s *Stop) c() chan struct{} {
	s.init.Do(func() { s.ch = make(chan struct{}) })
	return s.ch
}

// Stop closes Done. Calling it again does nothing.
func (s *Stop) Stop() { s.once.Do(func() { close(s.c()) }) }

// Done is closed once Stop has been called.
func (s *Stop) Done() <-chan struct{} { return s.c() }

// Stopped reports whether Stop has been called.
func (s *Stop) Stopped() bool {
	select {
	case <-s.c():
		return true
	default:
		return false
	}
}

// Context returns a child of ctx that is also cancelled by Stop. Call the
// cancel function when done with it.
func (s *Stop) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.c():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
