package lifecycle

import (
	"context"
	"errors"
	"sync"
)

// ErrAlreadyRun is returned by a second call of an actor's Run (or of the
// broker's Start), whether the first is still running or has returned: it
// runs once.
var ErrAlreadyRun = errors.New("already run: it runs once; make a new one to run again")

// Base is the lifecycle state of one actor, embedded in the component: it
// provides Stop and Ready, and Run guards the component's run with it. The
// zero value is ready to use; it must not be copied after first use.
type Base struct {
	mu    sync.Mutex
	ran   bool
	ready chan struct{}
	once  sync.Once
	stop  Stop
}

// Stop asks Run to drain and return; it does not wait. A Run that has not
// started yet returns nil at once without starting anything. Stop is
// idempotent and safe before Run, during it and after it has returned.
func (b *Base) Stop() { b.stop.Stop() }

// Ready is closed once the actor serves. A Run that fails or is stopped
// before it is ready never closes it: wait for it together with Run's
// return.
func (b *Base) Ready() <-chan struct{} { return b.readyChan() }

func (b *Base) readyChan() chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ready == nil {
		b.ready = make(chan struct{})
	}
	return b.ready
}

// claim marks b as run and reports whether it was the first claim.
func (b *Base) claim() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ran {
		return false
	}
	b.ran = true
	return true
}

// Run runs body as the one run of the actor whose state is b, and returns
// what body returns. A second Run returns ErrAlreadyRun; a Run after Stop
// returns nil without calling body.
//
// body gets a child of ctx and the Runner of this run. When body returns,
// its context and Runner.StopContext are cancelled and Run waits for the
// goroutines started with Runner.Go before it returns: a body that fails
// halfway through its start returns its error, and what it started ends
// with it.
func Run(ctx context.Context, b *Base, body func(ctx context.Context, r *Runner) error) error {
	if !b.claim() {
		return ErrAlreadyRun
	}
	if b.stop.Stopped() {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	stopCtx, cancelStop := b.stop.Context(ctx)
	r := &Runner{b: b, stopCtx: stopCtx}
	defer func() {
		r.mu.Lock()
		r.ending = true
		r.mu.Unlock()
		cancelStop()
		cancel()
		r.wg.Wait()
	}()
	return body(ctx, r)
}

// Runner is one run of an actor, as Run hands it to the body.
type Runner struct {
	b       *Base
	stopCtx context.Context

	// mu guards ending and the Add side of wg.
	mu     sync.Mutex
	ending bool
	wg     sync.WaitGroup
}

// MarkReady closes the actor's Ready channel; later calls do nothing.
func (r *Runner) MarkReady() {
	ready := r.b.readyChan()
	r.b.once.Do(func() { close(ready) })
}

// Stopping is closed once Stop has been called: the body starts its
// graceful drain.
func (r *Runner) Stopping() <-chan struct{} { return r.b.stop.Done() }

// StopContext is the body's context, also cancelled by Stop: for an actor
// whose graceful stop is to cancel its work.
func (r *Runner) StopContext() context.Context { return r.stopCtx }

// Go runs f on a goroutine that Run waits for before it returns; f must
// return once the body's context is done. Go reports false, and does not
// run f, once the body has returned: a callback that arrives late starts
// nothing.
func (r *Runner) Go(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ending {
		return false
	}
	r.wg.Go(f)
	return true
}

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
