// Package transcript reads a query's lines back from FLEET_QUERIES and
// writes its transcript from them (storage.StreamLine, resolving large-line
// pointers from storage). The archiver uses it to archive every finished
// query, and a worker's journal uses it to merge the chunks it stores late
// into a transcript already archived (Reader.MergeIfArchived): so it lives
// apart from both, where either role may import it.
package transcript
