package protocol_test

import (
	"errors"
	"fmt"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A worker receives a job on fleet.jobs.acme, decodes it with the codec named
// by its Content-Type header and validates it against the subject's tenant.
func ExampleDecodeJob() {
	names := protocol.NewNames("")
	tenant, err := names.ParseJobSubject("fleet.jobs.acme")
	if err != nil {
		panic(err)
	}

	body := []byte(`{"id":"q1","prompt":"Summarise README.md","options":{"max_turns":5},"future_field":true}`)
	job, err := protocol.DecodeJob("application/json; charset=utf-8", body)
	if err == nil {
		err = job.Validate(tenant, true)
	}
	fmt.Println(err, job.ID, job.Tenant, *job.Options.MaxTurns)
	fmt.Println(names.QueryMsg(job.Tenant, job.ID))

	// A bad job names the offending field, and still carries its identity
	// so a failed status with code invalid_job can be published.
	bad := []byte(`{"id":"q2","prompt":"x","options":{"max_turns":"ten"}}`)
	job, err = protocol.DecodeJob("", bad)
	var ve *protocol.ValidationError
	fmt.Println(errors.Is(err, protocol.ErrInvalidJob), errors.As(err, &ve), ve.Field, job.ID)
	fmt.Println(err)

	// Output:
	// <nil> q1 acme 5
	// fleet.query.acme.q1.msg
	// true true options.max_turns q2
	// invalid job: options.max_turns: must be an integer, got string
}

// Encoding a job for publishing: the codec also gives the Content-Type header.
func ExampleCodecFor() {
	codec, err := protocol.CodecFor(protocol.ContentTypeJSON)
	if err != nil {
		panic(err)
	}
	body, err := codec.Marshal(&protocol.Job{ID: "q1", Prompt: "hi", Tenant: "acme"})
	if err != nil {
		panic(err)
	}
	fmt.Println(codec.ContentType(), string(body))
	// Output:
	// application/json {"id":"q1","prompt":"hi","tenant":"acme","options":{}}
}

// The worker reads the agent's stdout with a LineReader and relays each
// line's bytes unchanged; the parsed header is only used for decisions.
func ExampleParseMessage() {
	line := []byte(`{"duration_ms":9,"is_error":true,"type":"result","subtype":"error_max_turns","errors":["Reached maximum number of turns (30)"],"session_id":"s1"}`)
	m := protocol.ParseMessage(line)
	fmt.Println(m.JSON, m.Type, m.Subtype, m.SessionID)
	r, err := m.AsResult()
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Success(), r.Errors[0])
	// Output:
	// true result error_max_turns s1
	// false Reached maximum number of turns (30)
}
