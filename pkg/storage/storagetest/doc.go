// Package storagetest holds what tests need around storage.Store:
//
//   - Exercise, the one suite every backend (FS, NATS KV and Object Store,
//     S3/R2, Workers KV, Mem) must pass. Backend differences are declared in
//     Features, never in if-branches of the suite.
//   - Mem, an in-memory Store (with Creator and StreamPutter) for other
//     packages' tests, with Wait to block until a key is written.
//   - Flaky, a wrapper that can be switched down or told to fail the next N
//     calls, returning errors that wrap storage.ErrUnavailable, and that
//     signals on a channel each time a call failed, so outage tests wait on
//     events instead of sleeping.
//
// This package is for tests only; production code must not import it.
package storagetest
