// Package securetest starts the documented secure profile of a fleet for
// end-to-end tests, from outside, as an operator would: `dispatcher auth
// init`, the real nats-server binary on the configuration it writes (JWT
// mode, resolver), `dispatcher serve --http --auth-dir` with webhooks on
// dispatcher.creds, and workers on worker.creds, contained by default,
// with the model gateway in front of a Messages API fake. Every part is a
// binary built once per test process from this module (and the
// nats-server module it requires).
package securetest
