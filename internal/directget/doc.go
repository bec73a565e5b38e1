// Package directget reads a JetStream stream with direct gets whose answer
// is several messages: a batch (next_by_subj with batch) or the last
// message on each of several subjects (multi_last). nats.go's requests
// return only the first reply, so such a get needs a subscription; a Mux
// receives the replies of all of a connection's gets on one wildcard inbox
// subscription, made on first use, and hands each get its own replies:
// no SUB and UNSUB per get (each one costs the server a subscription
// change), and no per-get subscription sized for a slow consumer.
//
// The archiver reads transcripts with batched gets (Page); the worker reads a
// query's last status and control message in one multi-last get when it
// claims a query (package fence), counts a group of lines it relayed
// (Count), and counts a query's lines when it continues one, reading them
// all (Each) in the rare case that the count shows they were stored out of
// Fleet-Seq order.
//
// Direct gets are answered by any replica of a stream that allows them
// (AllowDirect), possibly from a state that lags the leader; callers that
// need the leader's answer read there (fence.LastMsg) unless the stream
// has a single replica.
package directget
