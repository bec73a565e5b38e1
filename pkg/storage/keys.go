package storage

import "fmt"

// Key layout. Everything of one query lives under queries/<tenant>/<id>/;
// status records live under status/<tenant>/<id>.json so that a status-only
// backend (Workers KV) holds nothing else.
//
//	queries/<tenant>/<id>/transcript.ndjson                 the full transcript, raw lines in Fleet-Seq order
//	queries/<tenant>/<id>/chunks/<first seq %020d>.<attempt %06d>.ndjson   journal chunks, before assembly
//	queries/<tenant>/<id>/lines/<seq %020d>.json            lines too large for one NATS message
//	status/<tenant>/<id>.json                               the last StatusEvent

// QueryPrefix is the prefix of every object of one query.
func QueryPrefix(tenant, id string) string { return "queries/" + tenant + "/" + id + "/" }

// TranscriptKey is the key of a query's assembled transcript.
func TranscriptKey(tenant, id string) string { return QueryPrefix(tenant, id) + "transcript.ndjson" }

// ChunkPrefix is the prefix of a query's journal chunks.
func ChunkPrefix(tenant, id string) string { return QueryPrefix(tenant, id) + "chunks/" }

// ChunkKey is the key of the chunk whose first line has Fleet-Seq firstSeq.
// Keys sort in Fleet-Seq order.
func ChunkKey(tenant, id string, firstSeq uint64, attempt int) string {
	return fmt.Sprintf("%s%020d.%06d.ndjson", ChunkPrefix(tenant, id), firstSeq, attempt)
}

// LineKey is the key of one whole line that was too large for NATS.
func LineKey(tenant, id string, seq uint64) string {
	return fmt.Sprintf("%slines/%020d.json", QueryPrefix(tenant, id), seq)
}

// StatusKey is the key of a query's status record.
func StatusKey(tenant, id string) string { return "status/" + tenant + "/" + id + ".json" }

// StatusPrefix is the prefix of every status record of tenant ("" = all tenants).
func StatusPrefix(tenant string) string {
	if tenant == "" {
		return "status/"
	}
	return "status/" + tenant + "/"
}
