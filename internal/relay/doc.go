// Package relay carries one attempt's agent lines to the query's .msg
// subject in FLEET_QUERIES, in order, each journaled first: the worker's
// hottest path. A Relay is made per attempt (New), started once the
// attempt's claim is stored and its Fleet-Seq base is known (Start), fed
// one line at a time by the agent's reader (Emit), and ended by Flush (every
// line stored, or why not) and Shutdown (its goroutine gone).
//
// Lines carry the attempt's fence (package fence), so none is stored after
// a later attempt's claim; they go out through package jspub, many in
// flight, or in groups with one acknowledgement on a stream of one
// replica; a failed publish is recovered by reading the stream back and
// sending again, in order, from the first line not stored. See Relay for
// the guarantees, and recover.go and group.go for how they are kept.
package relay
