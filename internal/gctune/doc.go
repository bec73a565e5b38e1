// Package gctune sets the Go garbage collector's target for the fleet's
// long-running processes (worker, dispatcher serve).
//
// Their live heap is small (a few MB) and their allocation rate is steady
// (a few KB per job and per line), so with Go's default GOGC=100 they
// collect several times a second under load, and `make bench` shows the
// collector among their largest CPU costs. Percent (400) lets the heap
// grow to five times the live heap between collections: tens of MB at
// most, for a fraction of the collections. An idle process allocates
// almost nothing, so its RSS does not change (`make bench`: idle_rss_mb).
//
// GOGC and GOMEMLIMIT in the environment still win: Apply leaves the
// runtime's settings alone when either is set.
package gctune
