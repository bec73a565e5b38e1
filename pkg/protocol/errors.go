package protocol

import "errors"

// ErrInvalidJob is wrapped by every job decoding and validation error.
var ErrInvalidJob = errors.New("protocol: invalid job")

// ErrUnsupportedContentType is wrapped by CodecFor when a Content-Type header
// names neither JSON nor msgpack.
var ErrUnsupportedContentType = errors.New("protocol: unsupported content type")

// ErrNotResult is returned by Message.AsResult for a line whose type is not "result".
var ErrNotResult = errors.New("protocol: not a result message")

// ValidationError names the offending field of an invalid job.
// errors.Is(err, ErrInvalidJob) is true for every ValidationError.
type ValidationError struct {
	Field  string // JSON path of the field, e.g. "options.max_turns"
	Reason string
}

func (e *ValidationError) Error() string { return "invalid job: " + e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalidJob) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidJob }
