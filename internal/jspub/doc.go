// Package jspub publishes to a JetStream stream asynchronously, with every
// publish's acknowledgement (PubAck) delivered to one wildcard reply
// subscription per Publisher and read without reflection.
//
// It is what the worker's relay uses for agent lines, the fleet's hottest
// path: nats.go's jetstream.PublishMsgAsync registers a future with two
// channels per message and decodes each PubAck with encoding/json, which
// took 13% of the worker's CPU per relayed line. A Publisher keeps one map
// entry per message in flight; the caller owns ordering, timeouts and
// retries (the relay waits for its oldest line, and gives up on an
// acknowledgement after its PublishTimeout: see Ack and Forget).
//
// An acknowledgement resolves an Ack with the stored sequence, or with
// the stream's error as a *jetstream.APIError (so errors.As and error
// codes work as with nats.go), or jetstream.ErrNoStreamResponse when no
// stream listens on the subject.
package jspub
