// Package lifecycle is the actor contract of every component, written
// once: New validates; Run blocks until a clean stop (nil) or a failure;
// Stop asks for a graceful drain, does not wait, is idempotent and is safe
// before Run, during it and after it has returned (oklog/run's interrupt
// contract); cancelling Run's context is the hard stop.
//
// A component embeds Base, which gives it Stop and Ready, and makes its Run
// one call of the package function Run:
//
//	type Keeper struct {
//		lifecycle.Base
//		...
//	}
//
//	func (k *Keeper) Run(ctx context.Context) error {
//		return lifecycle.Run(ctx, &k.Base, k.run)
//	}
//
// Run makes the misuses safe: a second Run returns ErrAlreadyRun at once
// (an actor runs once; make another with New), a Run after Stop returns nil
// without starting anything, Ready is closed at most once, and when the
// body returns, with an error or not, its context is cancelled and every
// goroutine it started with Runner.Go has returned before Run does, so a
// failed start leaves nothing running. Package lifecycletest checks a
// component against the same misuses.
//
// Stop is the bare signal, for what is not an actor: a lease holder's
// renewals.
package lifecycle
