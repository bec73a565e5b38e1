// Package keyqueue runs background work per key, one item at a time, on
// one goroutine that a Queue starts and stops (pkg/startstop).
//
// The warm caches (docs/warm.md) prepare things between jobs: the repository cache
// a working tree of the commit it served last (pkg/repocache), the
// environment cache a copy of an entry it saved or restored
// (pkg/envcache). Both want the same queue: a request per key, the newest
// one winning while it waits (a later commit replaces an earlier one),
// keys served oldest first, nothing done once the owner stops, and the
// item under way cancelled by Stop.
package keyqueue
