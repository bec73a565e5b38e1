// Package startstop is the one lifecycle every long-lived service of the
// fleet shares (the worker, the dispatcher's parts, the admitter, the
// archiver, the journal), modelled on River's rivershared/startstop.
//
// A service holds a [Base] and calls [Base.Start] and [Base.Stop] from its
// own Start and Stop, passing the work that is its own. Base gives every
// service the same answers:
//
//   - Start on a new service runs start; if start fails the service is new
//     again (whatever start began it undoes itself), so Start may be
//     retried.
//   - A second Start while running returns [ErrAlreadyStarted].
//   - Start after Stop returns [ErrStopped]: a stopped service does not
//     start again; build a new one.
//   - Stop before Start marks the service stopped and runs nothing.
//   - A second Stop, or one racing the first, waits for the first and
//     returns its result.
//
// [Base.Started] and [Base.Stopped] are channels closed when the service
// began serving and when its Stop finished, for owners and tests that wait
// on events rather than on time.
//
// One owner starts and stops each service: the command that built it, or
// the service that built it as its part.
package startstop
