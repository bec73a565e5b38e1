package protocol

import "time"

// HeaderError carries the human-readable reason on a dead letter, beside
// its code in HeaderReason (for example invalid_job and "decode job:
// invalid character 'n' looking for beginning of value").
const HeaderError = "Fleet-Error"

// HeaderStreamSeq carries a dead letter's sequence in the jobs stream.
const HeaderStreamSeq = "Fleet-Stream-Seq"

// DeadLetter is one message of the dead-letter stream (<PREFIX>_DLQ), as
// the dispatcher lists it (fleet.api.list with dead_letters).
type DeadLetter struct {
	// Seq is its sequence in the dead-letter stream.
	Seq uint64 `json:"seq" msgpack:"seq"`
	// At is when it was dead-lettered.
	At time.Time `json:"at" msgpack:"at"`
	// Tenant is the tenant of its subject.
	Tenant string `json:"tenant" msgpack:"tenant"`
	// ID is the job's id when it could be read, else "".
	ID string `json:"id,omitempty" msgpack:"id,omitempty"`
	// Reason is a code: invalid_job (terminated by a worker: not decodable,
	// or failed validation) or max_deliveries.
	Reason string `json:"reason" msgpack:"reason"`
	// Error says why in words, when known.
	Error string `json:"error,omitempty" msgpack:"error,omitempty"`
	// JobSeq is its sequence in the jobs stream, when known.
	JobSeq uint64 `json:"job_seq,omitempty" msgpack:"job_seq,omitempty"`
	// Body is the start of the job's body (at most DeadLetterBodyBytes),
	// exactly as published.
	Body []byte `json:"body,omitempty" msgpack:"body,omitempty"`
	// Bytes is the size of the whole body.
	Bytes int `json:"bytes" msgpack:"bytes"`
}

// DeadLetterBodyBytes is how much of a dead letter's body a listing carries.
const DeadLetterBodyBytes = 1024
